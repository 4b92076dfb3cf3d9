// Command promql-lint parses every PromQL expression of Grafana dashboards and Prometheus rule
// files with Prometheus's own parser and prints the metric names they use.
//
//	promql-lint [-names | -exprs] FILE...
//
// A *.json file is a Grafana dashboard: every panel's targets[].expr (panels nested in rows
// included) and every query template variable (label_values(EXPR, label), query_result(EXPR))
// is checked, after Grafana's variables are substituted ($__rate_interval -> 1m, $__interval ->
// 1m, $__range -> 1h, any other $var, ${var}, ${var:fmt} or [[var]] -> .*). Dashboards are also
// held to Hydra's conventions: every query panel and target uses the ${datasource} variable,
// every query panel sets fieldConfig.defaults.unit, and every rate/irate/increase range is
// $__rate_interval. A *.yaml or *.yml file is a Prometheus rule file (groups[].rules[].expr).
//
// Output: one line per expression, "FILE<TAB>WHERE<TAB>name,name,...", where histogram series
// (_bucket, _sum, _count) are reported by their base name; with -names only the sorted union
// of the names, one per line; with -exprs one JSON object per expression,
// {"file", "where", "expr" (as substituted), "names"}, to run the expressions elsewhere. Exit status 1, with the panel title and the parser's error on
// stderr, when an expression does not parse or a convention is broken; 2 on a usage error.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

// rateInterval is what $__rate_interval becomes: one minute, spelled so that the range of a
// matrix selector shows whether it came from the variable.
const rateInterval = "1m0s"

var (
	varBraced  = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(:[^}]*)?\}`)
	varPlain   = regexp.MustCompile(`\$([A-Za-z0-9_]+)`)
	varBracket = regexp.MustCompile(`\[\[([A-Za-z0-9_]+)(:[^\]]*)?\]\]`)
	labelVals  = regexp.MustCompile(`(?s)^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)
	labelOnly  = regexp.MustCompile(`^\s*label_values\(\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
	queryRes   = regexp.MustCompile(`(?s)^\s*query_result\((.*)\)\s*$`)
)

func value(name string) string {
	switch name {
	case "__rate_interval":
		return rateInterval
	case "__interval":
		return "1m"
	case "__range":
		return "1h"
	case "__range_s", "__interval_ms", "__range_ms":
		return "3600"
	default:
		return ".*"
	}
}

// Substitute replaces Grafana's template variables with values the parser accepts.
func Substitute(expr string) string {
	expr = varBraced.ReplaceAllStringFunc(expr, func(m string) string {
		return value(varBraced.FindStringSubmatch(m)[1])
	})
	expr = varBracket.ReplaceAllStringFunc(expr, func(m string) string {
		return value(varBracket.FindStringSubmatch(m)[1])
	})
	return varPlain.ReplaceAllStringFunc(expr, func(m string) string {
		return value(varPlain.FindStringSubmatch(m)[1])
	})
}

// BaseName maps a histogram's series to the histogram's name.
func BaseName(name string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if strings.HasSuffix(name, s) {
			return strings.TrimSuffix(name, s)
		}
	}
	return name
}

type checker struct {
	problems []string
	all      map[string]bool
	out      []string
	exprs    []string // JSON lines for -exprs
}

func (c *checker) fail(file, where, format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("%s: %s: %s", file, where, fmt.Sprintf(format, args...)))
}

// expr parses one expression and records its metric names; dashboard expressions also have
// their rate ranges checked.
func (c *checker) expr(file, where, raw string, dashboard bool) {
	text := raw
	if dashboard {
		text = Substitute(raw)
	}
	e, err := parser.ParseExpr(text)
	if err != nil {
		c.fail(file, where, "%v\n  expression: %s", err, raw)
		return
	}
	names := map[string]bool{}
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			name := n.Name
			if name == "" {
				for _, m := range n.LabelMatchers {
					if m.Name == "__name__" {
						name = m.Value
					}
				}
			}
			if name != "" {
				names[BaseName(name)] = true
			}
		case *parser.Call:
			if !dashboard {
				break
			}
			switch n.Func.Name {
			case "rate", "irate", "increase":
				for _, a := range n.Args {
					ms, ok := a.(*parser.MatrixSelector)
					if !ok {
						continue
					}
					pr := ms.PositionRange()
					if !strings.HasSuffix(text[pr.Start:pr.End], "["+rateInterval+"]") {
						c.fail(file, where, "%s() over %q: use [$__rate_interval]", n.Func.Name,
							text[pr.Start:pr.End])
					}
				}
			}
		}
		return nil
	})
	list := make([]string, 0, len(names))
	for n := range names {
		list = append(list, n)
		c.all[n] = true
	}
	sort.Strings(list)
	c.out = append(c.out, fmt.Sprintf("%s\t%s\t%s", file, where, strings.Join(list, ",")))
	line, _ := json.Marshal(map[string]any{"file": file, "where": where, "expr": text, "names": list})
	c.exprs = append(c.exprs, string(line))
}

type panel struct {
	Title       string          `json:"title"`
	Type        string          `json:"type"`
	Datasource  json.RawMessage `json:"datasource"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		Expr       string          `json:"expr"`
		RefID      string          `json:"refId"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type dashboard struct {
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

// usesDatasourceVar: the datasource field is {"type":"prometheus","uid":"${datasource}"}.
func usesDatasourceVar(raw json.RawMessage) bool {
	var ds struct {
		UID string `json:"uid"`
	}
	if json.Unmarshal(raw, &ds) != nil {
		return false
	}
	return ds.UID == "${datasource}" || ds.UID == "$datasource"
}

func (c *checker) panels(file string, ps []panel) {
	for _, p := range ps {
		c.panels(file, p.Panels) // a collapsed row holds its panels
		if len(p.Targets) == 0 {
			continue
		}
		where := fmt.Sprintf("panel %q", p.Title)
		if !usesDatasourceVar(p.Datasource) {
			c.fail(file, where, "datasource is not ${datasource}")
		}
		if p.FieldConfig.Defaults.Unit == "" {
			c.fail(file, where, "no fieldConfig.defaults.unit")
		}
		for _, t := range p.Targets {
			w := fmt.Sprintf("%s target %s", where, t.RefID)
			if !usesDatasourceVar(t.Datasource) {
				c.fail(file, w, "datasource is not ${datasource}")
			}
			if strings.TrimSpace(t.Expr) == "" {
				c.fail(file, w, "no expr")
				continue
			}
			c.expr(file, w, t.Expr, true)
		}
	}
}

func (c *checker) dashboard(file string, data []byte) {
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		c.fail(file, "dashboard", "not JSON: %v", err)
		return
	}
	c.panels(file, d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := fmt.Sprintf("variable %q", v.Name)
		if !usesDatasourceVar(v.Datasource) {
			c.fail(file, where, "datasource is not ${datasource}")
		}
		var q string
		if json.Unmarshal(v.Query, &q) != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				c.fail(file, where, "query is neither a string nor {query: ...}")
				continue
			}
			q = obj.Query
		}
		switch {
		case labelOnly.MatchString(q):
		case labelVals.MatchString(q):
			c.expr(file, where, labelVals.FindStringSubmatch(q)[1], true)
		case queryRes.MatchString(q):
			c.expr(file, where, queryRes.FindStringSubmatch(q)[1], true)
		default:
			c.fail(file, where, "query %q is not label_values(...) or query_result(...)", q)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert  string `yaml:"alert"`
			Record string `yaml:"record"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func (c *checker) rules(file string, data []byte) {
	var rf ruleFile
	if err := yaml.Unmarshal(data, &rf); err != nil {
		c.fail(file, "rules", "not YAML: %v", err)
		return
	}
	if len(rf.Groups) == 0 {
		c.fail(file, "rules", "no groups")
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			c.expr(file, fmt.Sprintf("group %q rule %q", g.Name, name), r.Expr, false)
		}
	}
}

func main() {
	namesOnly := flag.Bool("names", false, "print only the sorted union of the metric names")
	exprsOut := flag.Bool("exprs", false, "print each expression, substituted, as a JSON line")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: promql-lint [-names | -exprs] DASHBOARD.json|RULES.yaml ...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	c := &checker{all: map[string]bool{}}
	for _, file := range flag.Args() {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		switch {
		case strings.HasSuffix(file, ".json"):
			c.dashboard(file, data)
		case strings.HasSuffix(file, ".yaml"), strings.HasSuffix(file, ".yml"):
			c.rules(file, data)
		default:
			fmt.Fprintf(os.Stderr, "%s: neither .json (dashboard) nor .yaml (rules)\n", file)
			os.Exit(2)
		}
	}
	if *exprsOut {
		for _, l := range c.exprs {
			fmt.Println(l)
		}
	} else if *namesOnly {
		names := make([]string, 0, len(c.all))
		for n := range c.all {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Println(n)
		}
	} else {
		for _, l := range c.out {
			fmt.Println(l)
		}
	}
	for _, p := range c.problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(c.problems) > 0 {
		fmt.Fprintf(os.Stderr, "promql-lint: %d problem(s)\n", len(c.problems))
		os.Exit(1)
	}
}
