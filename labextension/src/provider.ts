/**
 * The inline completion provider: asks the package's server extension for the middle of the cursor's
 * hole and streams it into JupyterLab's ghost text. A newer keystroke aborts the older request (the
 * server then stops its generation). When the user moves to a cell or a cell has run, `warm` has the
 * server prefill that cell's prompt, so the first keystroke there does not wait for the notebook's.
 */
import type {
  CompletionHandler,
  IInlineCompletionContext,
  IInlineCompletionItem,
  IInlineCompletionList,
  IInlineCompletionProvider
} from '@jupyterlab/completer';
import { URLExt } from '@jupyterlab/coreutils';
import type { NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';

import { documentContext, IDocumentContext } from './context';

/** The extension's settings (schema/plugin.json). */
export interface ISettings {
  enabled: boolean;
  maxTokens: number;
  debounceMs: number;
  repoContext: boolean;
  warmUp: boolean;
}

export const DEFAULT_SETTINGS: ISettings = {
  enabled: true,
  maxTokens: 64,
  debounceMs: 200,
  repoContext: true,
  warmUp: true
};

/** One answer line of `POST langchain-starcoder/complete`. */
interface IAnswerLine {
  text?: string;
  done?: boolean;
  finish_reason?: string;
  error?: string;
  /** `no_model`: the Jupyter server has no model (its configuration names one it cannot have). */
  code?: string;
  /** What to tell the user of a `no_model` answer, short (`error` has the whole story). */
  notice?: string;
}

/** How the user is told something once (a JupyterLab notification, else the console). */
export type Notify = (message: string) => void;

interface IPending {
  response: Promise<Response>;
  controller: AbortController;
}

export class StarCoderInlineProvider implements IInlineCompletionProvider {
  readonly name = 'StarCoder (langchain-starcoder)';
  readonly identifier = '@langchain-starcoder/jupyterlab:inline';
  /** JupyterLab's own provider settings: fill in the middle of a line too (a FIM model's job), no
   * debounce of its own (ours is in the settings), and time for a slow first token. */
  readonly schema = {
    default: { autoFillInMiddle: true, debouncerDelay: 0, timeout: 60000 }
  };

  settings: ISettings = { ...DEFAULT_SETTINGS };
  private _serverSettings = ServerConnection.makeSettings();
  private _current: AbortController | null = null;
  private _warming: AbortController | null = null;
  private _pending = new Map<string, IPending>();
  private _counter = 0;
  private _toldNoModel = false;

  /** `notify` tells the user, once, that the server has no model and how to fix it. */
  constructor(private readonly _notify: Notify = message => console.error(message)) {}

  async fetch(
    request: CompletionHandler.IRequest,
    context: IInlineCompletionContext
  ): Promise<IInlineCompletionList<IInlineCompletionItem>> {
    this._current?.abort(); // a newer keystroke: the older answer is not wanted any more
    const controller = new AbortController();
    this._current = controller;
    const document = this.settings.enabled ? documentContext(context.widget) : null;
    if (!document || !(await sleep(this.settings.debounceMs, controller.signal))) {
      return { items: [] };
    }
    const token = this._token();
    const body = this._body(document, request.text, request.offset, token);
    const response = this._post(body, controller.signal);
    response.catch(() => undefined); // read (and its error reported) by stream()
    this._pending.set(token, { response, controller });
    // The ghost text starts empty and grows as stream() reads the answer.
    return { items: [{ insertText: '', isIncomplete: true, token }] };
  }

  /**
   * Prefill the prompt of `panel`'s active cell at its cursor (after the debounce; a newer call aborts
   * it). The server answers nothing but its done line, and never lets it stop an answer being streamed.
   */
  async warm(panel: NotebookPanel): Promise<void> {
    this._warming?.abort();
    const controller = new AbortController();
    this._warming = controller;
    if (
      !this.settings.enabled ||
      !this.settings.warmUp ||
      !(await sleep(this.settings.debounceMs, controller.signal))
    ) {
      return;
    }
    const editor = panel.content.activeCell?.editor;
    const document = documentContext(panel);
    if (!editor || !document) {
      return;
    }
    const text = editor.model.sharedModel.getSource();
    const offset = editor.getOffsetAt(editor.getCursorPosition());
    const body = { ...this._body(document, text, offset, `warm-${this._token()}`), warm_up: true };
    try {
      const response = await this._post(body, controller.signal);
      if (response.ok) {
        await response.text();
      } else {
        for await (const answer of ndjson(response)) {
          this._noModel(answer); // a warm-up is the first to find it when a notebook opens
        }
      }
    } catch {
      // aborted by a newer warm-up, or the server is away: the next keystroke's request says so
    }
  }

  async *stream(token: string): AsyncGenerator<{ response: IInlineCompletionItem }> {
    const pending = this._pending.get(token);
    this._pending.delete(token);
    if (!pending) {
      return;
    }
    let text = '';
    try {
      const response = await pending.response;
      for await (const answer of ndjson(response)) {
        if (this._noModel(answer)) {
          return; // no ghost text: the user was told (once) how to give the server a model
        }
        if (answer.error !== undefined) {
          yield { response: { insertText: text, error: { message: answer.error } } };
          return;
        }
        if (answer.done) {
          if (answer.finish_reason !== 'superseded') {
            yield { response: { insertText: answer.text ?? text, isIncomplete: false } };
          }
          return;
        }
        text += answer.text ?? '';
        yield { response: { insertText: text, isIncomplete: true, token } };
      }
    } catch (reason) {
      if (!pending.controller.signal.aborted) {
        const message = reason instanceof Error ? reason.message : String(reason);
        yield { response: { insertText: text, error: { message } } };
      }
    } finally {
      pending.controller.abort(); // the ghost text was dismissed mid-stream: stop the generation
    }
  }

  /** Whether `answer` says the server has no model; the first such answer is shown to the user. */
  private _noModel(answer: IAnswerLine): boolean {
    if (answer.code !== 'no_model') {
      return false;
    }
    if (!this._toldNoModel) {
      this._toldNoModel = true;
      console.error(`langchain-starcoder: ${answer.error}`);
      this._notify(answer.notice ?? answer.error ?? 'No StarCoder model on the Jupyter server.');
    }
    return true;
  }

  private _token(): string {
    return `${Date.now()}-${++this._counter}`;
  }

  /** The request for the hole at `offset` in `text` (the cell's or the file's, as the editor holds it). */
  private _body(
    document: IDocumentContext,
    text: string,
    offset: number,
    token: string
  ): Record<string, unknown> {
    return {
      prefix: text.slice(0, offset),
      suffix: text.slice(offset),
      path: document.path,
      notebook: document.notebook,
      cell: document.cell,
      max_tokens: this.settings.maxTokens,
      repo_context: this.settings.repoContext,
      request_id: token
    };
  }

  private _post(body: Record<string, unknown>, signal: AbortSignal): Promise<Response> {
    const url = URLExt.join(this._serverSettings.baseUrl, 'langchain-starcoder', 'complete');
    const init = { method: 'POST', body: JSON.stringify(body), signal };
    return ServerConnection.makeRequest(url, init, this._serverSettings);
  }
}

/** The answer's lines as they arrive; an error status's `{"error"}` body as one line. */
async function* ndjson(response: Response): AsyncGenerator<IAnswerLine> {
  if (!response.ok || !response.body) {
    const body = await response.text();
    const error = `${response.status} ${response.statusText}`;
    let answer: IAnswerLine = {};
    try {
      answer = JSON.parse(body) as IAnswerLine;
    } catch {
      // not JSON: the status says it
    }
    yield { ...answer, error: answer.error ?? error };
    return;
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) {
      return;
    }
    buffer += value;
    const lines = buffer.split('\n');
    buffer = lines.pop() ?? '';
    for (const line of lines) {
      if (line.trim()) {
        yield JSON.parse(line) as IAnswerLine;
      }
    }
  }
}

/** Wait `ms` milliseconds; false when `signal` aborts first. */
function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  return new Promise(resolve => {
    if (signal.aborted) {
      resolve(false);
      return;
    }
    const timer = setTimeout(() => resolve(!signal.aborted), ms);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve(false);
    });
  });
}
