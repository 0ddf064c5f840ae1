/**
 * workbench's JupyterLab extension: the "Model serving" sidebar, and a command (in the palette and the launcher)
 * that opens a new notebook ready to start a server.
 */

import { ILayoutRestorer, type JupyterFrontEnd, type JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ILauncher } from '@jupyterlab/launcher';

import { servingIcon } from './icon';
import { servingNotebook } from './notebook';
import { ServingPanel } from './panel';

namespace CommandIDs {
  export const newNotebook = 'workbench:new-serving-notebook';
  export const showPanel = 'workbench:show-serving-panel';
}

const CATEGORY = 'Model Serving';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'workbench-serving-jupyterlab:plugin',
  description: 'A sidebar of the workbench model servers running in this Jupyter session.',
  autoStart: true,
  optional: [ICommandPalette, ILauncher, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    launcher: ILauncher | null,
    restorer: ILayoutRestorer | null
  ) => {
    const { commands, shell } = app;

    commands.addCommand(CommandIDs.newNotebook, {
      label: 'New Serving Notebook',
      caption: 'A new notebook with %load_ext workbench and %serve start ready to run',
      icon: servingIcon,
      execute: async args => {
        const cwd = typeof args.cwd === 'string' ? args.cwd : '';
        return openServingNotebook(app, cwd);
      }
    });

    const panel = new ServingPanel({ onNewNotebook: () => void commands.execute(CommandIDs.newNotebook) });
    panel.title.icon = servingIcon;
    panel.title.caption = 'Model serving';
    shell.add(panel, 'left', { rank: 850 });
    restorer?.add(panel, panel.id);

    commands.addCommand(CommandIDs.showPanel, {
      label: 'Show Model Serving Panel',
      caption: 'The workbench servers of this Jupyter session, their models and versions',
      execute: () => shell.activateById(panel.id)
    });

    palette?.addItem({ command: CommandIDs.newNotebook, category: CATEGORY });
    palette?.addItem({ command: CommandIDs.showPanel, category: CATEGORY });
    launcher?.add({ command: CommandIDs.newNotebook, category: 'Notebook', rank: 10 });
  }
};

/** Create `Untitled*.ipynb` in `cwd` with the serving cell, and open it with the default Python kernel. */
async function openServingNotebook(app: JupyterFrontEnd, cwd: string): Promise<unknown> {
  const { contents, kernelspecs } = app.serviceManager;
  await kernelspecs.ready;
  const specs = kernelspecs.specs;
  const name = specs?.default ?? 'python3';
  const spec = specs?.kernelspecs[name];
  const kernel = { name, display_name: spec?.display_name ?? 'Python 3', language: spec?.language ?? 'python' };
  const created = await contents.newUntitled({ path: cwd, type: 'notebook' });
  await contents.save(created.path, { type: 'notebook', format: 'json', content: servingNotebook(kernel) });
  return app.commands.execute('docmanager:open', { path: created.path, factory: 'Notebook', kernel: { name } });
}

export default plugin;
