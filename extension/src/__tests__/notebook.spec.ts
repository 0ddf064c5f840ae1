import type { ICodeCell, IMarkdownCell } from '@jupyterlab/nbformat';

import { SERVING_CELL, servingNotebook } from '../notebook';

const PYTHON3 = { name: 'python3', display_name: 'Python 3 (ipykernel)', language: 'python' };

describe('servingNotebook', () => {
  it('is nbformat 4 content', () => {
    const nb = servingNotebook(PYTHON3);
    expect(nb.nbformat).toBe(4);
    expect(nb.nbformat_minor).toBeGreaterThanOrEqual(0);
    expect(Array.isArray(nb.cells)).toBe(true);
  });

  it('has a note, then one code cell that loads the extension and starts a server', () => {
    const nb = servingNotebook(PYTHON3);
    expect(nb.cells.map(cell => cell.cell_type)).toEqual(['markdown', 'code']);
    const code = nb.cells[1] as ICodeCell;
    expect(code.source).toBe('%load_ext workbench\n%serve start');
    expect(SERVING_CELL).toBe('%load_ext workbench\n%serve start');
    // Not run yet: no outputs, no execution count.
    expect(code.outputs).toEqual([]);
    expect(code.execution_count).toBeNull();
    expect(code.metadata).toEqual({});
  });

  it('explains what the cell does in the note', () => {
    const note = servingNotebook(PYTHON3).cells[0] as IMarkdownCell;
    expect(typeof note.source).toBe('string');
    expect(note.source).toMatch(/^# /);
    expect(note.source).toContain('workbench-models');
    expect(note.source).toContain('%serve export');
    expect(note.source).toContain('Model serving');
  });

  it('uses the kernel spec it is given', () => {
    const nb = servingNotebook({ name: 'tf-gpu', display_name: 'TensorFlow (GPU)', language: 'python' });
    expect(nb.metadata.kernelspec).toEqual({ name: 'tf-gpu', display_name: 'TensorFlow (GPU)', language: 'python' });
    expect(nb.metadata.language_info).toEqual({ name: 'python' });
  });

  it('defaults the kernel language to python', () => {
    const nb = servingNotebook({ name: 'python3', display_name: 'Python 3' });
    expect(nb.metadata.kernelspec).toEqual({ name: 'python3', display_name: 'Python 3', language: 'python' });
  });

  it('returns new content each time', () => {
    const a = servingNotebook(PYTHON3);
    const b = servingNotebook(PYTHON3);
    expect(a).toEqual(b);
    expect(a).not.toBe(b);
    (a.cells[1] as ICodeCell).outputs.push({ output_type: 'stream', name: 'stdout', text: 'x' });
    expect((b.cells[1] as ICodeCell).outputs).toEqual([]);
  });

  it('survives a JSON round trip unchanged (it is saved through the contents API)', () => {
    const nb = servingNotebook(PYTHON3);
    expect(JSON.parse(JSON.stringify(nb))).toEqual(nb);
  });

  // FAILS with notebook.ts as it is: nbformat 4.5 (nbformat_minor 5, as declared) requires every cell to have an
  // `id` matching ^[a-zA-Z0-9-_]+$ (1 to 64 characters), unique in the notebook. Without one nbformat.validate
  // warns (MissingIDFieldWarning, "will become a hard error in future nbformat versions") when the server saves it.
  it('gives every cell the unique id nbformat 4.5 requires', () => {
    const nb = servingNotebook(PYTHON3);
    expect(nb.nbformat_minor).toBeGreaterThanOrEqual(5);
    const ids = nb.cells.map(cell => cell.id);
    expect(ids).toEqual(ids.map(() => expect.stringMatching(/^[a-zA-Z0-9-_]{1,64}$/)));
    expect(new Set(ids).size).toBe(ids.length);
  });
});
