/**
 * @langchain-starcoder/jupyterlab: inline completion (ghost text) from StarCoder2, answered by the
 * langchain-starcoder Jupyter server extension with the notebook's cells and outputs in the model's
 * own notebook format.
 */
import type { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICompletionProviderManager } from '@jupyterlab/completer';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { suggestAfterEnter } from './enter';
import { DEFAULT_SETTINGS, ISettings, StarCoderInlineProvider } from './provider';

const PLUGIN_ID = '@langchain-starcoder/jupyterlab:plugin';
/** @jupyterlab/apputils-extension's command that shows a notification. */
const NOTIFY = 'apputils:notify';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Inline completion from StarCoder2 (langchain-starcoder), notebook-aware.',
  autoStart: true,
  requires: [ICompletionProviderManager],
  optional: [ISettingRegistry, INotebookTracker],
  activate: (
    app: JupyterFrontEnd,
    manager: ICompletionProviderManager,
    registry: ISettingRegistry | null,
    notebooks: INotebookTracker | null
  ): void => {
    // JupyterLab's notification (its command, so that no other package is bundled), else the console.
    const notify = (message: string): void => {
      if (!app.commands.hasCommand(NOTIFY)) {
        console.error(message);
        return;
      }
      const args = { message, type: 'error', options: { autoClose: false } };
      app.commands.execute(NOTIFY, args).catch(() => console.error(message));
    };
    const provider = new StarCoderInlineProvider(notify);
    manager.registerInlineProvider(provider);
    // A new line after Enter gets ghost text too (JupyterLab asks nothing on a blank line).
    suggestAfterEnter(app, manager, () => provider.settings.enabled);
    if (notebooks) {
      // Where the next keystrokes will be: another cell, another notebook, or the cell after one that ran
      // (its outputs are the next prompt's context).
      const warm = (): void => {
        if (notebooks.currentWidget) {
          void provider.warm(notebooks.currentWidget);
        }
      };
      notebooks.activeCellChanged.connect(warm);
      notebooks.currentChanged.connect(warm);
      NotebookActions.executed.connect(warm);
    }
    if (!registry) {
      return;
    }
    const update = (settings: ISettingRegistry.ISettings): void => {
      provider.settings = {
        ...DEFAULT_SETTINGS,
        ...(settings.composite as Partial<ISettings>)
      };
    };
    registry
      .load(PLUGIN_ID)
      .then(settings => {
        update(settings);
        settings.changed.connect(update);
      })
      .catch(reason => console.error('langchain-starcoder: settings not loaded', reason));
  }
};

export default plugin;
