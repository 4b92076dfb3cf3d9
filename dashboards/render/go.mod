// Draws a Grafana dashboard's panels from a real Prometheus with gnuplot (docs tooling; the
// standard library only).
module hydra.dev/dashboards/render

go 1.24.0
