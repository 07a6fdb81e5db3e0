package console_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

// chromiumPath finds Debian's chromium (GD2FS_CHROMIUM overrides).
func chromiumPath() string {
	if p := os.Getenv("GD2FS_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// skip skips the browser test, saying so on stderr too: go test without
// -v does not print skip messages, and a skipped browser test must be seen.
func skip(t *testing.T, why string) {
	t.Helper()
	fmt.Fprintln(os.Stderr, "SKIP TestConsoleBrowser: "+why)
	t.Skip("SKIP browser test: " + why)
}

// TestConsoleBrowser loads every page of a real cluster in headless
// Chromium, logs in through the form, waits for the in-place refresh, checks
// the figures in the DOM against what the cluster holds, takes screenshots
// (into docs/console/ with GD2FS_UPDATE_SCREENSHOTS=1), and fails on any
// console error or uncaught exception.
func TestConsoleBrowser(t *testing.T) {
	path := chromiumPath()
	if path == "" {
		skip(t, "chromium not found (apt-get install chromium, or set GD2FS_CHROMIUM)")
	}
	start := time.Now()
	e := setup(t)
	t.Logf("cluster and fixture: %v", time.Since(start))

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-background-networking", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	start = time.Now()
	if err := chromedp.Do(ctx); err != nil {
		skip(t, fmt.Sprintf("chromium (%s) cannot start: %v", path, err))
	}
	t.Logf("chromium started: %v", time.Since(start))
	var mu sync.Mutex
	var problems []string
	msgs := chromedp.Console(ctx)
	const endMark = "gd2fs-console-test-end"
	seenEnd := make(chan struct{})
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleLog && m.Text == endMark {
				close(seenEnd)
				continue
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line))
				mu.Unlock()
			}
		}
	}()
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		tctx, c := context.WithTimeout(ctx, 30*time.Second)
		defer c()
		start := time.Now()
		if err := chromedp.Do(tctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %v", what, time.Since(start))
	}
	text := func(sel string) string {
		t.Helper()
		tctx, c := context.WithTimeout(ctx, 10*time.Second)
		defer c()
		s, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	eval := func(js string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return n
	}
	want := func(sel, wanted string) {
		t.Helper()
		if got := text(sel); got != wanted {
			t.Errorf("%s: %q, want %q", sel, got, wanted)
		}
	}
	shots := t.TempDir()
	if os.Getenv("GD2FS_UPDATE_SCREENSHOTS") != "" {
		shots = filepath.Join("..", "..", "docs", "console")
		os.MkdirAll(shots, 0o755)
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// fits checks a laptop screen (1280x800) shows the page without
	// scrolling sideways: wide tables scroll inside their box.
	fits := func(p string) {
		t.Helper()
		if n := eval(`document.documentElement.scrollWidth - window.innerWidth`); n > 0 {
			t.Errorf("%s is %d pixels wider than a 1280-pixel window", p, n)
		}
	}
	// open loads a page and waits until the script has refreshed it once
	// from JSON, so what is checked is what the refresh rendered.
	open := func(p string) {
		t.Helper()
		run("open "+p, chromedp.Navigate("about:blank"), chromedp.Navigate(e.url(p)+"#refresh=100"), chromedp.WaitReady(chromedp.CSS(`body[data-refreshed="1"]`)))
	}

	// Log in through the form.
	run("login", chromedp.Navigate(e.url("/ui/login?next=/ui/cluster")),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitReady(chromedp.CSS(`#servers`)))

	st, err := e.cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	open("/ui/cluster")
	want("#servers-up .value", "3 / 3")
	want("#files .value", fmt.Sprint(st.Files))
	want("#epoch .value", fmt.Sprint(st.Epoch))
	// A DRAM figure never wraps between its number and its unit.
	if n := eval(`/^[0-9.]+\u00a0[KMGT]?i?B \/ [0-9.]+\u00a0[KMGT]?i?B$/.test(document.querySelector("#dram .value").textContent) ? 1 : 0`); n != 1 {
		t.Errorf("DRAM figure %q can break inside a figure", text("#dram .value"))
	}
	if n := eval(`document.querySelectorAll(".logout").length`); n != 1 {
		t.Errorf("a cluster with a token: %d log out buttons, want 1", n)
	}
	if n := eval(`document.querySelectorAll("#servers tbody tr").length`); n != 3 {
		t.Errorf("servers table: %d rows", n)
	}
	if n := eval(`document.querySelectorAll("#banners .banner").length`); n != 0 {
		t.Errorf("cluster page: %d banners on a healthy cluster", n)
	}
	fits("cluster")
	shot("cluster")

	open("/ui/kv")
	want("#kv-keys .value", fmt.Sprint(e.kvKeys))
	var mem, disk, miss uint64
	var keys = map[string]int{}
	for _, s := range e.c.Servers {
		ks := s.KV().Stats()
		mem, disk, miss = mem+ks.MemHits, disk+ks.DiskHits, miss+ks.Misses
		keys[s.ID()] = ks.Keys
	}
	if int(mem+disk+miss) != e.gets || int(miss) != e.misses || disk == 0 {
		t.Fatalf("fixture: %d DRAM hits, %d disk hits, %d misses; want %d gets, %d misses, some from disk", mem, disk, miss, e.gets, e.misses)
	}
	want("#kv-hit-dram .value", fmt.Sprintf("%.1f%%", 100*float64(mem)/float64(e.gets)))
	want("#kv-hit-disk .value", fmt.Sprintf("%.1f%%", 100*float64(disk)/float64(e.gets)))
	for i := range e.c.Servers {
		id := e.c.Servers[i].ID()
		got := text(fmt.Sprintf(`#kv-servers tbody tr:nth-child(%d) td:nth-child(3)`, i+1))
		if got != fmt.Sprint(keys[id]) {
			t.Errorf("%s: %s keys on the page, %d on the server", id, got, keys[id])
		}
	}
	// Charts: the total's get latency and hit ratio lines are drawn.
	for _, sel := range []string{"#kv-total-hit path.s0", "#kv-total-get path.s1", "#kv-total-moves path.s1"} {
		if n := eval(fmt.Sprintf(`document.querySelector(%q).getAttribute("d").split("L").length`, sel)); n < 2 {
			t.Errorf("chart %s: %d points, want a line", sel, n)
		}
	}
	fits("kv")
	shot("kv")
	// Printed: no menu or buttons, black on white, charts kept.
	run("print media", func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Media: "print"})
		return chromedp.Void{}, err
	})
	if n := eval(`["header nav", "#pause", ".logout"].filter(s => getComputedStyle(document.querySelector(s)).display !== "none").length`); n != 0 {
		t.Errorf("print: %d of menu, pause and log out still shown", n)
	}
	if n := eval(`getComputedStyle(document.body).backgroundColor === "rgb(255, 255, 255)" && document.querySelectorAll(".chart svg path").length > 0 ? 1 : 0`); n != 1 {
		t.Error("print: background not white or charts gone")
	}
	shot("kv-print")
	run("screen media", func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Media: ""})
		return chromedp.Void{}, err
	})

	open("/ui/sessions")
	want("#sessions-count .value", fmt.Sprint(len(e.sessions)))
	want("#plans-total .value", fmt.Sprint(e.plans))
	want("#evictions .value", fmt.Sprint(e.evictions))
	if n := eval(`document.querySelectorAll("#evictions tbody tr").length`); n != e.evictions {
		t.Errorf("recent evictions: %d rows, want %d", n, e.evictions)
	}
	if n := eval(`document.querySelectorAll("#session-list tbody tr").length`); n != len(e.sessions) {
		t.Errorf("session list: %d rows, want %d", n, len(e.sessions))
	}
	// Search the hostile id: its ranges as a bar, its name as text.
	run("search", chromedp.SetValue(chromedp.CSS(`#search-id`), evilSession), chromedp.Submit(chromedp.CSS(`#search-id`)),
		chromedp.WaitReady(chromedp.CSS(`#session-bar`)))
	open("/ui/sessions?" + url.Values{"id": {evilSession}}.Encode())
	want("#session h2", "Session "+evilSession)
	if n := eval(`document.querySelectorAll("#session-bar rect").length`); n != e.evilRanges {
		t.Errorf("session bar: %d ranges, want %d", n, e.evilRanges)
	}
	if n := eval(`document.querySelectorAll("main img, main script").length`); n != 0 {
		t.Errorf("the hostile session id became %d elements", n)
	}
	fits("sessions")
	shot("sessions")
	// A session with reserved bytes and no commit says where its bytes are.
	open("/ui/sessions?" + url.Values{"id": {reservedSession}}.Encode())
	want("#session-tokens .value", "0")
	want("#session-bytes .sub", "0 B committed")
	if got := text("#session-files .sub"); !strings.Contains(got, "reserved by plans not committed") {
		t.Errorf("reserved-only session: files say %q", got)
	}

	open("/ui/models")
	want("#models-count .value", "2")
	want("#models-count .sub", fmt.Sprintf("%d files", e.modelFiles))
	row := eval(`[...document.querySelectorAll("#model-files tbody tr")].findIndex(r => r.cells[1].textContent === "model.safetensors")`)
	if row < 0 {
		t.Fatal("model.safetensors not listed")
	}
	want(fmt.Sprintf("#model-files tbody tr:nth-child(%d) td:nth-child(5)", row+1), "linked")
	want(fmt.Sprintf("#model-files tbody tr:nth-child(%d) td:nth-child(6)", row+1), "1.0 MiB (33.3%)")
	pulled := eval(`[...document.querySelectorAll("#model-files tbody tr")].findIndex(r => r.cells[1].textContent.includes("<img"))`)
	want(fmt.Sprintf("#model-files tbody tr:nth-child(%d) td:nth-child(5)", pulled+1), "pulled")
	want("#models-client-hit .value", "not reported")
	if n := eval(`[...document.querySelectorAll("#model-files td")].filter(td => td.textContent.includes("<img src=x onerror=alert(1)>")).length`); n != 1 {
		t.Errorf("hostile file name shown as text in %d cells, want 1", n)
	}
	if n := eval(`document.querySelectorAll("main img, main script").length`); n != 0 {
		t.Errorf("the hostile file name became %d elements", n)
	}
	fits("models")
	shot("models")

	// Messages arrive in order: once the mark is seen, every message the
	// pages wrote before it has been read.
	eval(`console.log("` + endMark + `"), 0`)
	select {
	case <-seenEnd:
	case <-time.After(10 * time.Second):
		t.Error("the console mark never arrived: console errors may be missing")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("browser console: %s", p)
	}
}
