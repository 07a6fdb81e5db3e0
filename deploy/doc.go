// Package deploy holds what runs gd2fs in production, and the tests that
// keep it true to the code: the Helm chart (helm/gd2fs, rendered by the
// separate module helm/charttest), systemd units (systemd), Prometheus
// alerting rules (prometheus) and a Grafana dashboard (grafana). See
// docs/deploy.md. scripts/ops-test.sh checks them with promtool,
// systemd-analyze and a real Prometheus.
package deploy
