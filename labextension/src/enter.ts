/**
 * Ghost text after Enter. JupyterLab's inline completer asks its providers at each keystroke, except
 * where the cursor's line is blank before the cursor (its handler skips those): after Enter, on a new
 * auto-indented line, nothing was suggested until a character was typed. As editors' assistants do,
 * this asks for the next line there, through the completer's own invoke: the same request as a
 * keystroke's, shown as the same ghost text (Tab accepts it).
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import type { ICompletionProviderManager } from '@jupyterlab/completer';
import { DocumentWidget } from '@jupyterlab/docregistry';
import { NotebookPanel } from '@jupyterlab/notebook';
import type { Widget } from '@lumino/widgets';

/** What is read of a cell's or a file's editor. */
interface IEditorLike {
  host: HTMLElement;
  getCursorPosition(): { line: number; column: number };
  getLine(line: number): string | undefined;
}

/**
 * Invoke the inline completer of the current notebook or file after a plain Enter in its editor
 * leaves the cursor on a blank line (while `enabled()`); returns what stops it.
 */
export function suggestAfterEnter(
  app: JupyterFrontEnd,
  manager: ICompletionProviderManager,
  enabled: () => boolean
): () => void {
  const onKeydown = (event: KeyboardEvent): void => {
    const modified = event.shiftKey || event.ctrlKey || event.altKey || event.metaKey;
    if (event.key !== 'Enter' || modified || event.isComposing || !enabled()) {
      return; // Shift+Enter and Ctrl+Enter run the cell
    }
    const widget = app.shell.currentWidget;
    const editor = widget ? editorOf(widget) : null;
    const inEditor = event.target instanceof Node && editor?.host.contains(event.target);
    if (!widget || !editor || !inEditor) {
      return;
    }
    // The editor inserts the new line in its own handler of this event: look once it has.
    setTimeout(() => {
      const { line, column } = editor.getCursorPosition();
      const before = editor.getLine(line)?.slice(0, column) ?? '';
      if (line > 0 && before.trim() === '' && app.shell.currentWidget === widget) {
        manager.inline?.invoke(widget.id);
      }
    }, 0);
  };
  document.addEventListener('keydown', onKeydown, true);
  return () => document.removeEventListener('keydown', onKeydown, true);
}

/** The editor of a notebook's active code cell or of a file; null for anything else. */
function editorOf(widget: Widget): IEditorLike | null {
  if (widget instanceof NotebookPanel) {
    const cell = widget.content.activeCell;
    return cell?.model.type === 'code' ? (cell.editor as IEditorLike | null) : null;
  }
  if (widget instanceof DocumentWidget) {
    return (widget.content as { editor?: IEditorLike }).editor ?? null;
  }
  return null;
}
