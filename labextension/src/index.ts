/**
 * pathways-kernel JupyterLab extension: the "Pathways" panel in the right
 * sidebar, following the active notebook's kernel, its status-bar item,
 * the "Pathways: Open Monitor" command and the update-rate setting; and the
 * main-area dashboard ("Pathways: Open Dashboard").
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, Notification, WidgetTracker } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { DASHBOARD_CHARTS, PathwaysDashboard } from './dashboard/dashboard';
import { asKernelView } from './protocol/session';
import { PathwaysPanel } from './panel/panel';
import { PathwaysStatus } from './panel/statusitem';
import { activateXprof } from './panel/xprof';
import { followProgress } from './notebook/followprogress';

const PLUGIN_ID = 'pathways-kernel:plugin';
const OPEN_COMMAND = 'pathways:open-monitor';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Live monitor for multi-slice JAX sessions (Pathways).',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  optional: [ICommandPalette, ISettingRegistry, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    settings: ISettingRegistry | null,
    statusBar: IStatusBar | null
  ) => {
    const panel = new PathwaysPanel();
    labShell.add(panel, 'right', { rank: 600 });
    // Run All scrolls past a live elastic cell: its progress is brought back into view.
    notebooks.widgetAdded.connect((_, notebook) => followProgress(notebook));
    // Any main-area tab: notebooks and consoles are followed, the rest named as not having a kernel.
    const follow = () => panel.follow(labShell.currentWidget ?? notebooks.currentWidget);
    labShell.currentChanged.connect(follow);
    follow();

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Pathways: Open Monitor',
      caption:
        'Show slices, utilization and elastic events of the active notebook’s Pathways kernel',
      execute: () => labShell.activateById(panel.id)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'Pathways' });
    activateXprof(
      app,
      palette,
      panel.node,
      () => panel.latestProfile(),
      () => notebooks.currentWidget?.id ?? null
    );

    if (statusBar) {
      const item = new PathwaysStatus(panel, () => void app.commands.execute(OPEN_COMMAND));
      statusBar.registerStatusItem(`${PLUGIN_ID}:status`, {
        item,
        align: 'left',
        rank: 4,
        // Shown once there are slices, and while the kernel says it is starting its server.
        isActive: () => panel.model.topology !== null || panel.session.state.kind === 'starting',
        activeStateChanged: panel.stateChanged
      });
    }

    if (settings) {
      void settings.load(PLUGIN_ID).then(
        loaded => {
          const apply = () => {
            panel.setRate(loaded.get('updateRate').composite as number);
            panel.setConfirmFail(loaded.get('confirmFail').composite as boolean);
          };
          loaded.changed.connect(apply);
          apply();
        },
        reason => console.warn('pathways: settings not loaded', reason)
      );
    }
  }
};

const DASHBOARD_PLUGIN_ID = 'pathways-kernel:dashboard';
const DASHBOARD_COMMAND = 'pathways:open-dashboard';
const CHART_COMMAND = 'pathways:open-chart';
/** Main-area width (CSS px) the dashboard wants; below it the left sidebar makes room. */
const DASHBOARD_ROOM_PX = 900;

/** "Pathways: Open Dashboard": a dockable main-area view of the active notebook's kernel, restored with the layout. */
const dashboardPlugin: JupyterFrontEndPlugin<void> = {
  id: DASHBOARD_PLUGIN_ID,
  description: 'Main-area charts of a Pathways kernel: utilization, memory, steps, events.',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    settings: ISettingRegistry | null
  ) => {
    const tracker = new WidgetTracker<MainAreaWidget<PathwaysDashboard>>({
      namespace: 'pathways-dashboard'
    });
    let rate = 2;
    let chipGiB = 16;
    const each = (fn: (d: PathwaysDashboard) => void) => tracker.forEach(w => fn(w.content));
    const titles = new Map(DASHBOARD_CHARTS.map(c => [c.id, c.title]));
    const offer = (id: string, title: string) => {
      if (!titles.has(id)) {
        titles.set(id, title);
        palette?.addItem({ command: CHART_COMMAND, category: 'Pathways', args: { chart: id } });
      }
    };

    app.commands.addCommand(DASHBOARD_COMMAND, {
      label: 'Pathways: Open Dashboard',
      caption:
        'Charts of utilization, memory, step time and events of the active notebook’s Pathways kernel',
      execute: () => {
        let widget = tracker.currentWidget;
        if (!widget || widget.isDisposed) {
          const dashboard = new PathwaysDashboard();
          dashboard.setRate(rate);
          dashboard.setEmulatedChipGiB(chipGiB);
          widget = new MainAreaWidget({ content: dashboard });
          widget.id = 'pathways-dashboard-area';
          widget.title.label = dashboard.title.label;
          widget.title.caption = dashboard.title.caption;
          widget.title.closable = true;
          const area = widget;
          // A chart's own tab opens below the dashboard (drag it anywhere, as any tab).
          dashboard.dock = tab => {
            const chartArea = new MainAreaWidget({ content: tab });
            chartArea.id = `${tab.id}-area`;
            chartArea.title.label = tab.title.label;
            chartArea.title.caption = tab.title.caption;
            chartArea.title.closable = true;
            app.shell.add(chartArea, 'main', {
              mode: 'split-bottom',
              ref: area.isAttached ? area.id : null
            });
            app.shell.activateById(chartArea.id);
          };
          dashboard.chartAdded = offer;
          void tracker.add(widget);
          // The active notebook or console; other tabs (the dashboard itself, a launcher) keep the last one.
          const follow = () => {
            const view = asKernelView(labShell.currentWidget);
            if (view) {
              dashboard.follow(view);
            }
          };
          labShell.currentChanged.connect(follow);
          dashboard.disposed.connect(() => labShell.currentChanged.disconnect(follow));
          dashboard.follow(asKernelView(labShell.currentWidget) ?? notebooks.currentWidget);
        }
        if (!widget.isAttached) {
          // A tab of its own at the main area's full width (a split left each chart ~350 px at
          // 1280x800); the file browser folds away when the charts would still be narrow.
          app.shell.add(widget, 'main', { mode: 'tab-after' });
          const main = document.getElementById('jp-main-dock-panel');
          if (main && main.clientWidth < DASHBOARD_ROOM_PX && !labShell.leftCollapsed) {
            labShell.collapseLeft();
          }
        }
        app.shell.activateById(widget.id);
      }
    });
    palette?.addItem({ command: DASHBOARD_COMMAND, category: 'Pathways' });

    // One chart in its own tab: the dashboard opens first if it is not (its data feed the tab).
    app.commands.addCommand(CHART_COMMAND, {
      label: args =>
        typeof args.chart === 'string'
          ? `Pathways: Open Chart “${titles.get(args.chart) ?? args.chart}” in a Tab`
          : 'Pathways: Open Chart in a Tab',
      caption:
        'Open one Pathways dashboard chart in its own main-area tab, live while the kernel runs',
      execute: async args => {
        const id = typeof args.chart === 'string' ? args.chart : 'utilization';
        if (!tracker.currentWidget || tracker.currentWidget.isDisposed) {
          await app.commands.execute(DASHBOARD_COMMAND);
        }
        const dashboard = tracker.currentWidget?.content;
        if (dashboard && !dashboard.openChart(id)) {
          Notification.info(
            `Pathways: no chart “${titles.get(id) ?? id}” yet; it appears once its data do.`,
            { autoClose: 6000 }
          );
        }
      }
    });
    for (const { id } of DASHBOARD_CHARTS) {
      palette?.addItem({ command: CHART_COMMAND, category: 'Pathways', args: { chart: id } });
    }
    void restorer?.restore(tracker, { command: DASHBOARD_COMMAND, name: () => 'dashboard' });

    if (settings) {
      void Promise.all([settings.load(PLUGIN_ID), settings.load(DASHBOARD_PLUGIN_ID)]).then(
        ([panel, dashboard]) => {
          const apply = () => {
            rate = panel.get('updateRate').composite as number;
            chipGiB = dashboard.get('emulatedChipMemoryGiB').composite as number;
            each(d => {
              d.setRate(rate);
              d.setEmulatedChipGiB(chipGiB);
            });
          };
          panel.changed.connect(apply);
          dashboard.changed.connect(apply);
          apply();
        },
        reason => console.warn('pathways: dashboard settings not loaded', reason)
      );
    }
  }
};

export default [plugin, dashboardPlugin];
