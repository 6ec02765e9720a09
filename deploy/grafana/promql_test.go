package grafana

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// promqlNames returns the metric names and the functions a PromQL
// expression uses. It skips what holds no metric name: strings (label
// values, label_replace's arguments), label matchers in braces, ranges and
// subqueries in brackets, the label lists of by, without, on, ignoring,
// group_left and group_right, numbers and durations, Grafana's $variables
// and comments. Of what is left, an identifier before "(", or before the
// by or without of an aggregation, is a function or an aggregation, a
// keyword is a keyword, and anything else is a metric.
func promqlNames(expr string) (metrics, functions []string, err error) {
	s := expr
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"' || c == '\'' || c == '`':
			if i, err = skipString(s, i); err != nil {
				return nil, nil, err
			}
		case c == '{':
			if i, err = skipGroup(s, i, '{', '}'); err != nil {
				return nil, nil, err
			}
		case c == '[':
			if i, err = skipGroup(s, i, '[', ']'); err != nil {
				return nil, nil, err
			}
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '$':
			i = skipVariable(s, i)
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			i = skipNumber(s, i)
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentPart(s[j]) {
				j++
			}
			ident := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n') {
				k++
			}
			// An aggregation's by or without may come before its
			// parenthesis: sum by (engine) (x).
			next := k
			for next < len(s) && isIdentPart(s[next]) {
				next++
			}
			word := strings.ToLower(s[k:next])
			call := (k < len(s) && s[k] == '(') || word == "by" || word == "without"
			switch word := strings.ToLower(ident); {
			case labelListKeywords[word]:
				if call {
					if k, err = skipGroup(s, k, '(', ')'); err != nil {
						return nil, nil, err
					}
					j = k
				}
			case keywords[word]:
			case call:
				functions = append(functions, ident)
			default:
				metrics = append(metrics, ident)
			}
			i = j
		case strings.IndexByte("()+-*/%^=!<>,@:", c) >= 0:
			i++
		default:
			return nil, nil, fmt.Errorf("%q: unexpected %q at %d", expr, c, i)
		}
	}
	return metrics, functions, nil
}

// labelListKeywords are followed by a list of label names.
var labelListKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// keywords are PromQL's other words that name no metric.
var keywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true, "atan2": true}

// promqlFunctions are PromQL's functions and aggregation operators (start
// and end are the @ modifier's).
var promqlFunctions = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`
		sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
		abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week
		day_of_year days_in_month delta deriv double_exponential_smoothing exp floor
		histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev
		histogram_stdvar histogram_sum holt_winters hour idelta increase info irate label_join
		label_replace ln log10 log2 minute month predict_linear rate resets round scalar sgn sort
		sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year
		avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time
		stddev_over_time stdvar_over_time last_over_time present_over_time mad_over_time
		acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg rad pi start end`) {
		promqlFunctions[f] = true
	}
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdentPart(c byte) bool  { return isIdentStart(c) || isDigit(c) }

// skipString returns the index past the string that starts at i.
// Backquoted strings have no escapes.
func skipString(s string, i int) (int, error) {
	quote := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && quote != '`':
			j++
		case s[j] == quote:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("%q: a string at %d does not end", s, i)
}

// skipGroup returns the index past the group that opens at i, strings in
// it included.
func skipGroup(s string, i int, open, close byte) (int, error) {
	depth := 0
	for j := i; j < len(s); {
		switch c := s[j]; {
		case c == '"' || c == '\'' || c == '`':
			var err error
			if j, err = skipString(s, j); err != nil {
				return 0, err
			}
			continue
		case c == open:
			depth++
		case c == close:
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		}
		j++
	}
	return 0, fmt.Errorf("%q: %q at %d is not closed", s, open, i)
}

// skipVariable returns the index past a Grafana variable: $name or
// ${name} (${name:format} too).
func skipVariable(s string, i int) int {
	if i+1 < len(s) && s[i+1] == '{' {
		if end := strings.IndexByte(s[i:], '}'); end >= 0 {
			return i + end + 1
		}
		return len(s)
	}
	j := i + 1
	for j < len(s) && isIdentPart(s[j]) && s[j] != ':' {
		j++
	}
	return j
}

// skipNumber returns the index past a number or a duration: 0.99, 1e-3,
// 0x1f, 5m, 1h30m.
func skipNumber(s string, i int) int {
	j := i
	for j < len(s) {
		c := s[j]
		switch {
		case isDigit(c) || c == '.' || c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z'):
			j++
		case (c == '+' || c == '-') && j > i && s[j-1]|0x20 == 'e' && !strings.ContainsAny(s[i:j], "xX"):
			j++
		default:
			return j
		}
	}
	return j
}

func TestPromQLNames(t *testing.T) {
	for _, tc := range []struct {
		expr               string
		metrics, functions []string
	}{
		{`vllm:num_requests_running{model_name=~"$model_name", engine=~"$engine"}`, []string{"vllm:num_requests_running"}, nil},
		{`histogram_quantile(0.99, sum by (le, engine) (rate(vllm:time_to_first_token_seconds_bucket{model_name=~"$model_name"}[$__rate_interval])))`,
			[]string{"vllm:time_to_first_token_seconds_bucket"}, []string{"histogram_quantile", "sum", "rate"}},
		{`sum(rate(a_total[5m])) by (engine) / ignoring(reason) group_left sum without (reason) (b_total offset 1h)`,
			[]string{"a_total", "b_total"}, []string{"sum", "rate", "sum"}},
		{`max(x) - min(x) > bool 1e-3 or vector(0) unless on(instance) y @ start()`,
			[]string{"x", "x", "y"}, []string{"max", "min", "vector", "start"}},
		{`label_replace(up{job="a,b) c"}, "dst", "$1", "src", "(.*)") # a comment with_words(here)`,
			[]string{"up"}, []string{"label_replace"}},
		{`count(count_values("epoch", dpnode_coordinator_epoch)) and rate(z[5m:30s]) * 0x1F`,
			[]string{"dpnode_coordinator_epoch", "z"}, []string{"count", "count_values", "rate"}},
		{"SUM BY (engine) (`raw{}` ~ x)", nil, nil},
	} {
		metrics, functions, err := promqlNames(tc.expr)
		if tc.metrics == nil && tc.functions == nil {
			if err == nil {
				t.Errorf("%s: no error, want one", tc.expr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if !slices.Equal(metrics, tc.metrics) || !slices.Equal(functions, tc.functions) {
			t.Errorf("%s:\nmetrics %q, functions %q\nwant    %q, functions %q", tc.expr, metrics, functions, tc.metrics, tc.functions)
		}
	}
}
