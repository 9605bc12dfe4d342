"""neuron-monitor: reports of the runtimes' and the system's metric groups (`config`:
the configuration file; `groups` and `system`: the metric groups; `monitor`: when each
is collected and the report) and their Prometheus exporter (`exporter`)."""
