// Command render draws a Grafana dashboard's panels from a real Prometheus, without Grafana:
// it runs each panel's targets (template variables substituted the way Grafana does) as
// query_range (time series) or instant queries (tables, stats), and draws every panel at its
// gridPos with its title, legend (legendFormat) and unit into one PNG, using gnuplot's pngcairo
// terminal in Grafana's dark theme.
//
//	render -dashboard dashboards/hydra-job.json -prometheus http://127.0.0.1:9090 \
//	    -start 1700000000 -end 1700000600 [-scrape-interval 15s] [-var job=gpt2-sweep ...] \
//	    -o docs/images/hydra-job-dashboard.png
//
// Variables not given with -var take Grafana's "All" value (.*); $__rate_interval is Grafana's
// max($__interval + scrape interval, 4 x scrape interval), with $__interval the query step.
// Supported panel types: timeseries (lines, bars, stacking), table, stat; units: bytes, Bps,
// s, percentunit, ops, short, none and "suffix:<text>".
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Grafana's grid: 24 columns, 30 px rows.
const (
	rowPx    = 30
	headerPx = 56
	gapPx    = 8
)

var palette = []string{"#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1",
	"#BA43A9", "#705DA0", "#508642", "#CCA300", "#447EBC", "#C15C17"}

type target struct {
	Expr    string `json:"expr"`
	Legend  string `json:"legendFormat"`
	Instant bool   `json:"instant"`
	RefID   string `json:"refId"`
}

type panel struct {
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	GridPos     struct{ X, Y, W, H int } `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit     string   `json:"unit"`
			Decimals *int     `json:"decimals"`
			Min      *float64 `json:"min"`
			Max      *float64 `json:"max"`
			Custom   struct {
				DrawStyle string `json:"drawStyle"`
				Stacking  struct {
					Mode string `json:"mode"`
				} `json:"stacking"`
			} `json:"custom"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Transformations []struct {
		ID      string `json:"id"`
		Options struct {
			ExcludeByName map[string]bool   `json:"excludeByName"`
			RenameByName  map[string]string `json:"renameByName"`
		} `json:"options"`
	} `json:"transformations"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"`
}

type dashboard struct {
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
}

type series struct {
	Labels map[string]string
	T      []float64
	V      []float64
}

type varsFlag map[string]string

func (v varsFlag) String() string { return fmt.Sprint(map[string]string(v)) }
func (v varsFlag) Set(s string) error {
	k, val, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("want NAME=VALUE, got %q", s)
	}
	v[k] = val
	return nil
}

var (
	varBraced  = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(:[^}]*)?\}`)
	varPlain   = regexp.MustCompile(`\$([A-Za-z0-9_]+)`)
	legendVars = regexp.MustCompile(`\{\{\s*([A-Za-z0-9_]+)\s*\}\}`)
)

func substitute(expr string, vars map[string]string) string {
	get := func(name string) string {
		if v, ok := vars[name]; ok {
			return v
		}
		return ".*"
	}
	expr = varBraced.ReplaceAllStringFunc(expr, func(m string) string {
		return get(varBraced.FindStringSubmatch(m)[1])
	})
	return varPlain.ReplaceAllStringFunc(expr, func(m string) string {
		return get(varPlain.FindStringSubmatch(m)[1])
	})
}

func promGet(base, path string, params url.Values) ([]json.RawMessage, error) {
	resp, err := http.Get(base + path + "?" + params.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", path, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s %s: %s", path, params.Get("query"), r.Error)
	}
	return r.Data.Result, nil
}

func parseValue(raw json.RawMessage) (float64, float64) {
	var pair [2]json.RawMessage
	json.Unmarshal(raw, &pair)
	var t float64
	var s string
	json.Unmarshal(pair[0], &t)
	json.Unmarshal(pair[1], &s)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		v = math.NaN()
	}
	return t, v
}

func queryRange(base, expr string, start, end, step float64) ([]series, error) {
	res, err := promGet(base, "/api/v1/query_range", url.Values{"query": {expr},
		"start": {fmt.Sprint(start)}, "end": {fmt.Sprint(end)}, "step": {fmt.Sprint(step)}})
	if err != nil {
		return nil, err
	}
	var out []series
	for _, r := range res {
		var m struct {
			Metric map[string]string `json:"metric"`
			Values []json.RawMessage `json:"values"`
		}
		json.Unmarshal(r, &m)
		s := series{Labels: m.Metric}
		for _, pv := range m.Values {
			t, v := parseValue(pv)
			s.T = append(s.T, t)
			s.V = append(s.V, v)
		}
		out = append(out, s)
	}
	return out, nil
}

func queryInstant(base, expr string, at float64) ([]series, error) {
	res, err := promGet(base, "/api/v1/query", url.Values{"query": {expr}, "time": {fmt.Sprint(at)}})
	if err != nil {
		return nil, err
	}
	var out []series
	for _, r := range res {
		var m struct {
			Metric map[string]string `json:"metric"`
			Value  json.RawMessage   `json:"value"`
		}
		json.Unmarshal(r, &m)
		t, v := parseValue(m.Value)
		out = append(out, series{Labels: m.Metric, T: []float64{t}, V: []float64{v}})
	}
	return out, nil
}

func legend(format string, labels map[string]string) string {
	if format == "" {
		keys := make([]string, 0, len(labels))
		for k := range labels {
			if k != "__name__" {
				keys = append(keys, k+"=\""+labels[k]+"\"")
			}
		}
		sort.Strings(keys)
		return labels["__name__"] + "{" + strings.Join(keys, ", ") + "}"
	}
	return legendVars.ReplaceAllStringFunc(format, func(m string) string {
		return labels[legendVars.FindStringSubmatch(m)[1]]
	})
}

// axis returns the scale to divide values by and the gnuplot tick format for a unit.
func axis(unit string, maxAbs float64) (float64, string) {
	iec := func(suffix string) (float64, string) {
		units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
		scale := 1.0
		i := 0
		for maxAbs/scale >= 1024 && i < len(units)-1 {
			scale *= 1024
			i++
		}
		return scale, "%.3g " + units[i] + suffix
	}
	si := func(suffix string) (float64, string) {
		switch {
		case maxAbs >= 1e9:
			return 1e9, "%.3gG" + suffix
		case maxAbs >= 1e6:
			return 1e6, "%.3gM" + suffix
		case maxAbs >= 1e4:
			return 1e3, "%.4gK" + suffix
		}
		return 1, "%.4g" + suffix
	}
	switch {
	case unit == "bytes":
		return iec("")
	case unit == "Bps":
		return iec("/s")
	case unit == "s":
		if maxAbs < 1 {
			return 1e-3, "%.3g ms"
		}
		return 1, "%.3g s"
	case unit == "percentunit":
		return 0.01, "%.0f%%"
	case unit == "ops":
		return si(" ops/s")
	case strings.HasPrefix(unit, "suffix:"):
		return si(" " + strings.TrimSpace(strings.TrimPrefix(unit, "suffix:")))
	}
	return si("")
}

func formatValue(unit string, v float64, decimals *int) string {
	if math.IsNaN(v) {
		return "NaN"
	}
	scale, f := axis(unit, math.Abs(v))
	if decimals != nil {
		f = strings.Replace(f, "%.3g", "%."+strconv.Itoa(*decimals)+"f", 1)
	}
	return strings.ReplaceAll(fmt.Sprintf(f, v/scale), "%%", "%")
}

// plain quotes text for labels drawn with the noenhanced option.
func plain(s string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `"`, `\"`) + `"`
}

type canvas struct {
	w, h int
	b    strings.Builder
	data int
}

func (c *canvas) sx(px float64) float64 { return px / float64(c.w) }
func (c *canvas) sy(px float64) float64 { return 1 - px/float64(c.h) }

func (c *canvas) p(format string, args ...any) { fmt.Fprintf(&c.b, format+"\n", args...) }

// box draws a panel's frame and title and sets the plot margins inside it; it returns the
// panel's pixel rectangle.
func (c *canvas) box(p panel) (x0, y0, x1, y1 float64) {
	cw := float64(c.w-gapPx) / 24
	x0 = float64(p.GridPos.X)*cw + gapPx
	x1 = float64(p.GridPos.X+p.GridPos.W) * cw
	y0 = headerPx + float64(p.GridPos.Y*rowPx)
	y1 = headerPx + float64((p.GridPos.Y+p.GridPos.H)*rowPx) - gapPx
	c.p(`set object 1 rect from screen %.5f,%.5f to screen %.5f,%.5f behind fc rgb "#181b1f" fs solid 1.0 border lc rgb "#2c3235"`,
		c.sx(x0), c.sy(y1), c.sx(x1), c.sy(y0))
	c.p(`set label 1 %s at screen %.5f,%.5f left tc rgb "#ccccdc" font "DejaVu Sans Bold,10" noenhanced`,
		plain(p.Title), c.sx(x0+10), c.sy(y0+16))
	return
}

func (c *canvas) blank() {
	c.p("unset border; unset tics; unset key; unset xdata; set xrange [0:1]; set yrange [0:1]")
	c.p("set lmargin at screen 0; set rmargin at screen 1; set tmargin at screen 1; set bmargin at screen 0")
	c.p("plot NaN notitle")
	c.p("unset label; unset object 1; set border; set tics")
}

func (c *canvas) noData(x0, y0, x1, y1 float64, msg string) {
	c.p(`set label 2 %s at screen %.5f,%.5f center tc rgb "#8e8e8e" font "DejaVu Sans,11" noenhanced`,
		plain(msg), c.sx((x0+x1)/2), c.sy((y0+y1)/2))
	c.blank()
}

func (c *canvas) timeseries(p panel, all [][]series, legends [][]string, start, end float64) {
	x0, y0, x1, y1 := c.box(p)
	type line struct {
		s     series
		title string
	}
	var lines []line
	maxAbs := 0.0
	for i, ss := range all {
		for j, s := range ss {
			lines = append(lines, line{s, legends[i][j]})
		}
	}
	if len(lines) == 0 {
		c.noData(x0, y0, x1, y1, "No data")
		return
	}
	d := p.FieldConfig.Defaults
	stacked := d.Custom.Stacking.Mode == "normal"
	// Stacking: each series drawn from the sum of those before it, at the same timestamps.
	base := map[float64]float64{}
	type band struct{ t, lo, hi []float64 }
	bands := make([]band, len(lines))
	for i, l := range lines {
		for k, t := range l.s.T {
			v := l.s.V[k]
			lo := 0.0
			if stacked {
				lo = base[t]
				if !math.IsNaN(v) {
					base[t] = lo + v
				}
			}
			bands[i].t = append(bands[i].t, t)
			bands[i].lo = append(bands[i].lo, lo)
			bands[i].hi = append(bands[i].hi, lo+v)
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				maxAbs = math.Max(maxAbs, math.Abs(lo+v))
			}
		}
	}
	if d.Max != nil {
		maxAbs = math.Max(maxAbs, *d.Max)
	}
	scale, format := axis(d.Unit, maxAbs)
	perRow := int(math.Max(1, (x1-x0-20)/170))
	rows := (len(lines) + perRow - 1) / perRow
	legendPx := float64(rows)*15 + 6
	// Ticks at a round step, about six to a panel.
	tick := 1.0
	for _, t := range []float64{5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600} {
		if (end-start)/t <= 6 {
			tick = t
			break
		}
		tick = t
	}
	xfmt := "%H:%M"
	if tick < 60 {
		xfmt = "%H:%M:%S"
	}
	c.p("set xdata time; set timefmt \"%%s\"; set format x \"%s\"; set xtics %.0f", xfmt, tick)
	c.p("set xrange [%.0f:%.0f]", start, end)
	ymin, ymax := "*", "*"
	if d.Min != nil {
		ymin = fmt.Sprint(*d.Min / scale)
	}
	if d.Max != nil {
		ymax = fmt.Sprint(*d.Max / scale)
	}
	c.p("set yrange [%s:%s]", ymin, ymax)
	c.p("set format y %s", plain(format))
	c.p("set lmargin at screen %.5f; set rmargin at screen %.5f", c.sx(x0+92), c.sx(x1-12))
	c.p("set tmargin at screen %.5f; set bmargin at screen %.5f", c.sy(y0+28), c.sy(y1-22-legendPx))
	c.p(`set key at screen %.5f,%.5f left top horizontal reverse Left maxcols %d width -2 samplen 1.5 spacing 1.1 tc rgb "#ccccdc" font "DejaVu Sans,8" noenhanced`,
		c.sx(x0+10), c.sy(y1-legendPx+2), perRow)
	var plots []string
	for i, l := range lines {
		c.data++
		name := fmt.Sprintf("$d%d", c.data)
		c.p("%s << EOD", name)
		for k := range bands[i].t {
			lo, hi := bands[i].lo[k]/scale, bands[i].hi[k]/scale
			if math.IsNaN(hi) || math.IsInf(hi, 0) {
				c.p("") // a gap, like Grafana's null
				continue
			}
			c.p("%.3f %.6g %.6g", bands[i].t[k], lo, hi)
		}
		c.p("EOD")
		color := palette[i%len(palette)]
		switch {
		case stacked:
			plots = append(plots, fmt.Sprintf(`%s using 1:2:3 with filledcurves fc rgb "%s" fs transparent solid 0.55 noborder title %s`,
				name, color, plain(l.title)))
		case d.Custom.DrawStyle == "bars":
			plots = append(plots, fmt.Sprintf(`%s using 1:3 with impulses lw 4 lc rgb "%s" title %s`, name, color, plain(l.title)))
		default:
			plots = append(plots, fmt.Sprintf(`%s using 1:3 with lines lw 2 lc rgb "%s" title %s`, name, color, plain(l.title)))
		}
	}
	c.p("plot %s", strings.Join(plots, ", \\\n     "))
	c.p("unset label; unset object 1; unset key; unset xdata")
}

func (c *canvas) table(p panel, all [][]series) {
	x0, y0, x1, y1 := c.box(p)
	exclude := map[string]bool{}
	rename := map[string]string{}
	for _, t := range p.Transformations {
		if t.ID == "organize" {
			for k, v := range t.Options.ExcludeByName {
				exclude[k] = v
			}
			for k, v := range t.Options.RenameByName {
				rename[k] = v
			}
		}
	}
	var rowsData []series
	for _, ss := range all {
		rowsData = append(rowsData, ss...)
	}
	if len(rowsData) == 0 {
		c.noData(x0, y0, x1, y1, "No data")
		return
	}
	colSet := map[string]bool{}
	for _, s := range rowsData {
		for k := range s.Labels {
			if !exclude[k] {
				colSet[k] = true
			}
		}
	}
	var cols []string
	for k := range colSet {
		cols = append(cols, k)
	}
	sort.Strings(cols)
	showValue := !exclude["Value"]
	header := append([]string{}, cols...)
	if showValue {
		header = append(header, "Value")
	}
	// Columns as wide as their longest text (about 7 px a character).
	widest := make([]int, len(header))
	for i, h := range header {
		widest[i] = len(h)
		if r, ok := rename[h]; ok {
			widest[i] = len(r)
		}
	}
	for _, s := range rowsData {
		for i, col := range cols {
			widest[i] = max(widest[i], len(s.Labels[col]))
		}
	}
	colX := make([]float64, len(header))
	for i := 1; i < len(header); i++ {
		colX[i] = colX[i-1] + float64(widest[i-1]+4)*7
	}
	label := 2
	put := func(text string, col int, y float64, color, font string) {
		c.p(`set label %d %s at screen %.5f,%.5f left tc rgb "%s" font "%s" noenhanced`,
			label, plain(text), c.sx(x0+10+colX[col]), c.sy(y), color, font)
		label++
	}
	for i, h := range header {
		name := h
		if r, ok := rename[h]; ok {
			name = r
		}
		put(name, i, y0+46, "#6ea6ff", "DejaVu Sans Bold,9")
	}
	c.p(`set arrow 1 from screen %.5f,%.5f to screen %.5f,%.5f nohead lc rgb "#2c3235"`,
		c.sx(x0+6), c.sy(y0+56), c.sx(x1-6), c.sy(y0+56))
	for r, s := range rowsData {
		y := y0 + 74 + float64(r)*20
		if y > y1-8 {
			break
		}
		for i, col := range cols {
			put(s.Labels[col], i, y, "#ccccdc", "DejaVu Sans,9")
		}
		if showValue {
			put(formatValue(p.FieldConfig.Defaults.Unit, s.V[0], p.FieldConfig.Defaults.Decimals),
				len(cols), y, "#73bf69", "DejaVu Sans Bold,10")
		}
	}
	c.blank()
	c.p("unset arrow 1")
}

func (c *canvas) stat(p panel, all [][]series, legends [][]string) {
	x0, y0, x1, y1 := c.box(p)
	var texts []string
	for i, ss := range all {
		for j, s := range ss {
			texts = append(texts, legends[i][j]+"  "+formatValue(p.FieldConfig.Defaults.Unit, s.V[0], p.FieldConfig.Defaults.Decimals))
		}
	}
	if len(texts) == 0 {
		c.noData(x0, y0, x1, y1, "No data")
		return
	}
	for i, t := range texts {
		y := y0 + 40 + (y1-y0-40)*(float64(i)+0.5)/float64(len(texts))
		c.p(`set label %d %s at screen %.5f,%.5f center tc rgb "#73bf69" font "DejaVu Sans Bold,16" noenhanced`,
			i+2, plain(t), c.sx((x0+x1)/2), c.sy(y))
	}
	c.blank()
}

func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		if p.Type == "row" {
			out = append(out, flatten(p.Panels)...)
			continue
		}
		out = append(out, p)
	}
	return out
}

func main() {
	vars := varsFlag{}
	dashPath := flag.String("dashboard", "", "Grafana dashboard JSON")
	prom := flag.String("prometheus", "http://127.0.0.1:9090", "Prometheus base URL")
	startF := flag.Int64("start", 0, "range start, Unix seconds (default: end - 1h)")
	endF := flag.Int64("end", 0, "range end, Unix seconds (default: now)")
	stepF := flag.Duration("step", 0, "query step (default: range / 400, at least 1s)")
	scrape := flag.Duration("scrape-interval", 15*time.Second, "Prometheus's scrape interval")
	width := flag.Int("width", 1600, "image width in pixels")
	out := flag.String("o", "dashboard.png", "PNG to write")
	flag.Var(vars, "var", "template variable NAME=VALUE (repeatable); others are All (.*)")
	flag.Parse()
	if *dashPath == "" {
		flag.Usage()
		os.Exit(2)
	}
	raw, err := os.ReadFile(*dashPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", *dashPath, err)
		os.Exit(1)
	}
	end := float64(*endF)
	if end == 0 {
		end = float64(time.Now().Unix())
	}
	start := float64(*startF)
	if start == 0 {
		start = end - 3600
	}
	step := stepF.Seconds()
	if step == 0 {
		step = math.Max(1, math.Round((end-start)/400))
	}
	rate := math.Max(step+scrape.Seconds(), 4*scrape.Seconds())
	all := map[string]string{"__rate_interval": fmt.Sprintf("%.0fs", rate),
		"__interval": fmt.Sprintf("%.0fs", step), "__range": fmt.Sprintf("%.0fs", end-start)}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			all[v.Name] = ".*"
		}
	}
	for k, v := range vars {
		all[k] = v
	}

	panels := flatten(d.Panels)
	bottom := 0
	for _, p := range panels {
		bottom = max(bottom, p.GridPos.Y+p.GridPos.H)
	}
	c := &canvas{w: *width, h: headerPx + bottom*rowPx + gapPx}
	c.p(`set terminal pngcairo size %d,%d background rgb "#111217" font "DejaVu Sans,9"`, c.w, c.h)
	c.p("set output %s", plain(*out))
	c.p(`set border lc rgb "#5a5d66"; set tics tc rgb "#a0a3ab" nomirror; set grid lc rgb "#2c3235" lw 1`)
	c.p("set multiplot")
	var shown []string
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			val := all[v.Name]
			if val == ".*" {
				val = "All"
			}
			shown = append(shown, v.Name+": "+val)
		}
	}
	c.p(`set label 1 %s at screen %.5f,%.5f left tc rgb "#ccccdc" font "DejaVu Sans Bold,14" noenhanced`,
		plain(d.Title), c.sx(gapPx+4), c.sy(24))
	c.p(`set label 2 %s at screen %.5f,%.5f left tc rgb "#a0a3ab" font "DejaVu Sans,10" noenhanced`,
		plain(strings.Join(shown, "    ")), c.sx(gapPx+4), c.sy(46))
	c.p(`set label 3 %s at screen %.5f,%.5f right tc rgb "#a0a3ab" font "DejaVu Sans,10" noenhanced`,
		plain(fmt.Sprintf("%s to %s UTC   (rendered from Prometheus by dashboards/render)",
			time.Unix(int64(start), 0).UTC().Format("2006-01-02 15:04:05"),
			time.Unix(int64(end), 0).UTC().Format("15:04:05"))), c.sx(float64(c.w-gapPx-4)), c.sy(46))
	c.blank()
	failed := false
	for _, p := range panels {
		var results [][]series
		var legends [][]string
		for _, t := range p.Targets {
			expr := substitute(t.Expr, all)
			var ss []series
			var err error
			if p.Type == "timeseries" && !t.Instant {
				ss, err = queryRange(*prom, expr, start, end, step)
			} else {
				ss, err = queryInstant(*prom, expr, end)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "panel %q target %s: %v\n", p.Title, t.RefID, err)
				failed = true
				continue
			}
			sort.SliceStable(ss, func(i, j int) bool {
				return legend(t.Legend, ss[i].Labels) < legend(t.Legend, ss[j].Labels)
			})
			var ls []string
			for _, s := range ss {
				ls = append(ls, legend(t.Legend, s.Labels))
			}
			results = append(results, ss)
			legends = append(legends, ls)
			fmt.Fprintf(os.Stderr, "render: %-38s %-2s %3d series  %s\n", p.Title, t.RefID, len(ss), expr)
		}
		switch p.Type {
		case "timeseries":
			c.timeseries(p, results, legends, start, end)
		case "table":
			c.table(p, results)
		case "stat":
			c.stat(p, results, legends)
		default:
			x0, y0, x1, y1 := c.box(p)
			c.noData(x0, y0, x1, y1, "panel type "+p.Type+" is not rendered")
		}
	}
	c.p("unset multiplot")
	script := *out + ".gp"
	if err := os.WriteFile(script, []byte(c.b.String()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("gnuplot", script)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "gnuplot %s: %v\n", script, err)
		os.Exit(1)
	}
	os.Remove(script)
	fmt.Fprintf(os.Stderr, "render: wrote %s (%dx%d)\n", *out, c.w, c.h)
	if failed {
		os.Exit(1)
	}
}
