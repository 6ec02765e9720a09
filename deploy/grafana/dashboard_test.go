package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard's JSON that the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	Targets    []struct {
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	// Panels are a collapsed row's.
	Panels []panel `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Query is a string, or an object with the query in its field query.
	Query      json.RawMessage `json:"query"`
	Datasource *datasource     `json:"datasource"`
}

// query is a query variable's PromQL-side text: label_values(...).
func (v variable) query() (string, error) {
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	err := json.Unmarshal(v.Query, &o)
	return o.Query, err
}

// dsVariable is the data source variable every panel queries through, so
// that the dashboard imports as it is and asks for a Prometheus.
const dsVariable = "DS_PROMETHEUS"

// builtinVariables are Grafana's own.
var builtinVariables = []string{"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"}

// variableRef is a Grafana variable in a query: $name, ${name} or
// ${name:format}.
var variableRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)

// labelValues is a query variable's label_values(selector, label), or
// label_values(label).
var labelValues = regexp.MustCompile(`^label_values\((?:(.*),)?\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$`)

func loadDashboard(t *testing.T) *dashboard {
	b, err := os.ReadFile("dpnode.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dpnode.json: %v", err)
	}
	return &d
}

// queries returns every PromQL expression of the dashboard, each with
// where it is: the panels' targets and the query variables' selectors.
func (d *dashboard) queries() (map[string]string, []error) {
	q := map[string]string{}
	var errs []error
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				q[fmt.Sprintf("panel %q, target %d", p.Title, i)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		text, err := v.query()
		m := labelValues.FindStringSubmatch(strings.TrimSpace(text))
		if err != nil || m == nil {
			errs = append(errs, fmt.Errorf("variable %s: query %s is not label_values(selector, label)", v.Name, v.Query))
			continue
		}
		q["variable "+v.Name] = m[1]
	}
	return q, errs
}

// TestDashboard checks that the dashboard imports as it is (every panel on
// the data source variable, every variable it uses defined) and that every
// metric its queries name is a series dpnode exports, every function one
// of PromQL's, and every dpnode and vLLM metric on some panel.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("the dashboard needs a uid and a title, to be imported and linked")
	}
	defined := slices.Clone(builtinVariables)
	for _, v := range d.Templating.List {
		defined = append(defined, v.Name)
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${"+dsVariable+"}") {
			t.Errorf("variable %s: queries %v, not ${%s}", v.Name, v.Datasource, dsVariable)
		}
	}
	if i := slices.IndexFunc(d.Templating.List, func(v variable) bool { return v.Name == dsVariable }); i < 0 || d.Templating.List[i].Type != "datasource" {
		t.Errorf("no data source variable %s", dsVariable)
	} else if q, _ := d.Templating.List[i].query(); q != "prometheus" {
		t.Errorf("variable %s: of data sources of type %q, want prometheus", dsVariable, q)
	}
	for _, name := range []string{"model_name", "engine"} {
		if !slices.Contains(defined, name) {
			t.Errorf("no variable %s", name)
		}
	}

	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, ok := ids[p.ID]; ok {
				t.Errorf("panels %q and %q share the id %d", prev, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.Type != "row" {
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no query", p.Title)
				}
				for _, ds := range []*datasource{p.Datasource} {
					if ds == nil || ds.UID != "${"+dsVariable+"}" {
						t.Errorf("panel %q: data source %v, not ${%s}", p.Title, ds, dsVariable)
					}
				}
				for i, tg := range p.Targets {
					if tg.Datasource != nil && tg.Datasource.UID != "${"+dsVariable+"}" {
						t.Errorf("panel %q, target %d: data source %v, not ${%s}", p.Title, i, tg.Datasource, dsVariable)
					}
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)

	exported, err := exportedSeries()
	if err != nil {
		t.Fatal(err)
	}
	queries, errs := d.queries()
	for _, err := range errs {
		t.Error(err)
	}
	shown := map[string]bool{}
	for where, expr := range queries {
		if strings.TrimSpace(expr) == "" && !strings.HasPrefix(where, "variable") {
			t.Errorf("%s: empty query", where)
		}
		for _, m := range variableRef.FindAllStringSubmatch(expr, -1) {
			if !slices.Contains(defined, m[1]) {
				t.Errorf("%s: $%s is no variable of the dashboard", where, m[1])
			}
		}
		metrics, functions, err := promqlNames(expr)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		for _, m := range metrics {
			family, ok := exported[m]
			if !ok {
				t.Errorf("%s: %s is no series that dpnode exports", where, m)
			}
			shown[family] = true
		}
		for _, f := range functions {
			if !promqlFunctions[strings.ToLower(f)] {
				t.Errorf("%s: %s is no PromQL function", where, f)
			}
		}
	}
	// dpnode's and vLLM's metrics all have a panel: a metric added to
	// dpnode without one fails here. A histogram is shown when any of
	// its series is.
	for _, family := range exported {
		if (strings.HasPrefix(family, "dpnode_") || strings.HasPrefix(family, "vllm:")) && !shown[family] {
			t.Errorf("%s is on no panel of the dashboard", family)
			shown[family] = true // once
		}
	}
}
