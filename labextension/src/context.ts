/**
 * What the server needs to know about the hole: the document's path, and for a notebook its live
 * cells (sources as the editor shows them, outputs as text) with the index of the hole's cell.
 */
import { DocumentWidget } from '@jupyterlab/docregistry';
import { NotebookPanel } from '@jupyterlab/notebook';
import type { Widget } from '@lumino/widgets';
import type * as nbformat from '@jupyterlab/nbformat';

/** The hole's document, as the completion request describes it. */
export interface IDocumentContext {
  /** The path relative to the server's root. */
  path: string;
  /** The live notebook as nbformat-4 JSON, or null for a file. */
  notebook: nbformat.INotebookContent | null;
  /** The index of the hole's cell in `notebook.cells`, or null for a file. */
  cell: number | null;
}

/** The notebook or file that `widget` shows; null for anything else (a console). */
export function documentContext(widget: Widget): IDocumentContext | null {
  if (widget instanceof NotebookPanel) {
    const notebook = widget.content;
    const cell = notebook.activeCellIndex;
    if (!notebook.model || notebook.activeCell?.model.type !== 'code') {
      return null;
    }
    return {
      path: widget.context.path,
      notebook: textOnly(notebook.model.toJSON() as nbformat.INotebookContent),
      cell
    };
  }
  if (widget instanceof DocumentWidget) {
    return { path: widget.context.path, notebook: null, cell: null };
  }
  return null;
}

/**
 * The notebook with rich output data (images, HTML) emptied: the server renders them as a marker
 * naming their MIME type, so their bytes need not travel on every keystroke.
 */
function textOnly(content: nbformat.INotebookContent): nbformat.INotebookContent {
  for (const cell of content.cells) {
    cell.attachments = undefined;
    for (const output of (cell.outputs as nbformat.IOutput[] | undefined) ?? []) {
      const data = output.data as Record<string, unknown> | undefined;
      for (const mime of Object.keys(data ?? {})) {
        if (mime !== 'text/plain' && data) {
          data[mime] = '';
        }
      }
    }
  }
  return content;
}
