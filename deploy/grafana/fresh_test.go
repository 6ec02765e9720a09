package grafana

import (
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dpnode/dpnode/node"
)

// TestFreshNodeExportsEverySeries: every series dpnode registers is on a
// node's /metrics before anything happened, at zero, so that an alert on
// rate(x) > 0 and a dashboard's panel read 0, not "No data".
func TestFreshNodeExportsEverySeries(t *testing.T) {
	series, err := exportedSeries()
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := node.DefaultOptions()
	o.Host, o.Port = "127.0.0.1", 0
	o.Bind, o.RPCPort = "127.0.0.1:0", 0
	o.APIKeyFile = keys
	o.Logger = slog.New(slog.DiscardHandler)
	run, err := node.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := run.Shutdown(); err != nil {
			t.Error(err)
		}
	}()
	resp, err := http.Get("http://" + run.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	got, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, family := range series {
		if got[family] == nil && !slices.Contains(missing, family) {
			missing = append(missing, family)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Fatalf("a fresh node exports no series of %q", missing)
	}
}
