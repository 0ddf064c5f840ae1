import { LabIcon } from '@jupyterlab/ui-components';

/** A stack of model versions with a signal going out: the sidebar's tab and the launcher item. */
const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M3 5.5 12 2l9 3.5-9 3.5L3 5.5z"/>
    <path d="M3 9.5l2.2-.85L12 11.3l6.8-2.65L21 9.5 12 13 3 9.5z" opacity=".8"/>
    <path d="M3 13.5l2.2-.85L12 15.3l6.8-2.65L21 13.5 12 17 3 13.5z" opacity=".6"/>
    <path d="M11 18.5h2V22h-2zM6 20h12v2H6z"/>
  </g>
</svg>`;

export const servingIcon = new LabIcon({ name: 'workbench:serving', svgstr: svg });
