// The shape seq2serve's dashboard must have, built from Grafana's own types.
// Grafana's panel type is open (`type: string`, `options: Record<string, unknown>`),
// so each panel kind used here is pinned to its plugin's Options and FieldConfig.
import type { Dashboard, DataSourceRef, Panel, RowPanel } from "@grafana/schema";
import type {
  Options as StatOptions,
} from "@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen";
import type {
  FieldConfig as TimeSeriesFieldConfig,
  Options as TimeSeriesOptions,
} from "@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen";

// JSON spells a string enum member by its value ("absolute", not
// ThresholdsMode.Absolute): accept the values of string enums, nothing else.
export type Loose<T> = T extends string
  ? `${T}`
  : T extends readonly (infer E)[]
    ? Loose<E>[]
    : T extends object
      ? { [K in keyof T]: Loose<T[K]> }
      : T;

// @grafana/schema has no Prometheus query type; these are the fields the
// Prometheus data source reads.
export interface PrometheusQuery {
  refId: string;
  datasource?: DataSourceRef;
  expr: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  format?: "time_series" | "table" | "heatmap";
  editorMode?: "code" | "builder";
  interval?: string;
}

type PluginPanel<Type extends string, Options, Custom> =
  Omit<Panel<Options, Custom>, "type" | "options" | "targets" | "datasource"> & {
    type: Type;
    datasource: DataSourceRef;
    options: Options;
    targets: PrometheusQuery[];
  };

export type SeqPanel =
  | PluginPanel<"timeseries", TimeSeriesOptions, TimeSeriesFieldConfig>
  | PluginPanel<"stat", StatOptions, Record<string, never>>
  | (Omit<RowPanel, "type"> & { type: "row" });

export type SeqDashboard = Omit<Dashboard, "panels"> & {
  uid: string;
  title: string;
  panels: SeqPanel[];
};
