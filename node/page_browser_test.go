//go:build browser

package node_test

import (
	"cmp"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestClusterPageInABrowser opens the cluster page of a two-node cluster
// whose API needs a key in Debian's chromium, headless, at a laptop's
// screen size: the page asks for the key, then shows every rank; when one
// node is killed, its ranks turn unserved without a reload. It saves a
// screenshot and prints where.
func TestClusterPageInABrowser(t *testing.T) {
	chromium := cmp.Or(os.Getenv("CHROMIUM"), "/usr/bin/chromium")
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("this test needs Debian's chromium (apt-get install chromium), or CHROMIUM set to a Chrome: %v", err)
	}
	const key = "page-test-key"
	args := func(ip string, extra ...string) []string {
		return nodeArgs(ip, append([]string{"--host", ip, "--port", "0", "--api-key", key,
			"--data-parallel-size", "4", "--data-parallel-size-local", "2"}, extra...)...)
	}
	a := startProc(t, "127.0.0.85", args("127.0.0.85")...)
	b := startProc(t, "127.0.0.86", args("127.0.0.86", "--data-parallel-start-rank", "2", "--seeds", "127.0.0.85:7946")...)

	// The browser lives as long as the context of its first action: no
	// timeout on it; each wait below is bounded instead.
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1366, 768))...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(browser, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(browser, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluating %s: %v", expr, err)
		}
		return v
	}
	// ranks reads the page's rank rows: "rank:state" each, in order.
	const ranks = `[...document.querySelectorAll("tr[data-rank]")].map(r => r.dataset.rank + ":" + r.dataset.state).join(" ")`
	waitRanks := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for got := eval(ranks); got != want; got = eval(ranks) {
			if time.Now().After(deadline) {
				t.Fatalf("the page shows ranks %q; want %q", got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	do("opening the page", chromedp.Navigate(a.url+"/cluster"), chromedp.WaitVisible(chromedp.ID("key-input")))
	do("giving the key", chromedp.SendKeys(chromedp.ID("key-input"), key), chromedp.Click(chromedp.CSS("#key-form button")))
	waitRanks("0:ready 1:ready 2:ready 3:ready")
	// A mark on the page's window: a reload would drop it.
	eval(`window.notReloaded = "yes"`)

	b.signal(syscall.SIGKILL)
	waitRanks("0:ready 1:ready 2:unserved 3:unserved")
	if eval(`String(window.notReloaded)`) != "yes" {
		t.Fatal("the page was reloaded")
	}
	if eval(`String(document.querySelector('tr[data-kind="node_gone"], tr[data-kind="node_left"]') !== null)`) != "true" {
		t.Fatal("the events list does not show the killed node")
	}

	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("taking a screenshot: %v", err)
	}
	dir, err := os.MkdirTemp("", "dpnode-cluster-page")
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "cluster.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the cluster page: %s", shot)
}
