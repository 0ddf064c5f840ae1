/** The notebook the launcher item and the "New Serving Notebook" command open, ready to run. */

import type { INotebookContent } from '@jupyterlab/nbformat';

export const SERVING_CELL = '%load_ext workbench\n%serve start';

/** nbformat 4 content with a note and the cell that starts a server; `kernel` is a kernel spec name. */
export function servingNotebook(kernel: { name: string; display_name: string; language?: string }): INotebookContent {
  return {
    cells: [
      {
        cell_type: 'markdown',
        id: 'serving-note',
        metadata: {},
        source:
          '# Serving from this notebook\n\n' +
          'Run the cell below: it starts a workbench server on the `workbench-models` folder beside this ' +
          'notebook (TF Serving REST and gRPC on free ports), and the **Model serving** sidebar lists it.\n\n' +
          'Export a model into it with `%serve export <variable> <model-name>`; `%serve --help` lists the rest.'
      },
      { cell_type: 'code', id: 'serving-start', metadata: {}, source: SERVING_CELL, outputs: [], execution_count: null }
    ],
    metadata: {
      kernelspec: { name: kernel.name, display_name: kernel.display_name, language: kernel.language ?? 'python' },
      language_info: { name: 'python' }
    },
    nbformat: 4,
    nbformat_minor: 5
  };
}
