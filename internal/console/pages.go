package console

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
)

func (c *Console) clusterView(ctx context.Context, v *View, st api.Status, leads bool) {
	var up, down []string
	var memU, memC, diskU, diskC, chunks, served, cold int64
	t := &Table{ID: "servers", Head: []string{"server", "address", "state", "last heartbeat", "DRAM used / capacity", "disk used / capacity",
		"chunks", "served", "from S3"}, Empty: "no servers have registered yet: start some with 'gd2fs server --master ...'"}
	for _, s := range st.Servers {
		if s.State == "up" {
			up = append(up, s.ID)
		} else {
			down = append(down, s.ID)
		}
		memU += s.MemUsed
		memC += s.MemCap
		diskU += s.DiskUsed
		diskC += s.DiskCap
		chunks += int64(s.Chunks)
		served += s.ServedBytes
		cold += s.ColdBytes
		t.Rows = append(t.Rows, []Cell{txt(s.ID), txt(s.Addr), {Text: s.State, Class: "state-" + s.State},
			{Text: ago(s.LastSeen), Title: s.LastSeen.UTC().Format(time.RFC3339)},
			txt(usedOf(s.MemUsed, s.MemCap)), txt(usedOf(s.DiskUsed, s.DiskCap)), txt(count(int64(s.Chunks))),
			txt(size(s.ServedBytes)), txt(size(s.ColdBytes))})
	}
	// A standby hears no heartbeats: every server looks down there.
	if len(down) > 0 && leads {
		v.Banners = append(v.Banners, Banner{Level: "error", Text: fmt.Sprintf("%d server(s) down: %s", len(down), strings.Join(down, ", "))})
	}
	var rp Repairs
	if leads {
		var err error
		if rp, err = c.src.Repairs(ctx); err != nil {
			v.Banners = append(v.Banners, Banner{Level: "error", Text: "repairs: " + err.Error()})
		}
	}
	if rp.UnderReplicated > 0 {
		when := fmt.Sprintf("repair copies them once a server has been down %s", rp.After)
		if rp.After < 0 {
			when = "repair is disabled on this master"
		}
		v.Banners = append(v.Banners, Banner{Level: "warn", Text: fmt.Sprintf(
			"%d HA chunk(s) under-replicated (a replica is on a down server); %s. Repaired since the master started: %d, failed attempts: %d.",
			rp.UnderReplicated, when, rp.Done, rp.Failed)})
	}
	warm := "–"
	if served > 0 {
		warm = ratio(1 - float64(cold)/float64(served))
	}
	v.Sections = append(v.Sections, Section{ID: "overview", Title: "Cluster " + st.Cluster, Stats: []Stat{
		{ID: "servers-up", Label: "servers up", Value: fmt.Sprintf("%d / %d", len(up), len(st.Servers))},
		{ID: "epoch", Label: "epoch", Value: count(st.Epoch)},
		{ID: "files", Label: "files", Value: count(st.Files), Sub: size(st.Bytes)},
		{ID: "dram", Label: "DRAM", Value: usedOf(memU, memC), Meter: frac(memU, memC)},
		{ID: "disk", Label: "disk", Value: usedOf(diskU, diskC), Meter: frac(diskU, diskC)},
		{ID: "chunks", Label: "chunks held", Value: count(chunks)},
		{ID: "served", Label: "served", Value: size(served), Sub: size(cold) + " from S3 · warm hit ratio " + warm},
		{ID: "repairs", Label: "HA chunks under-replicated", Value: count(rp.UnderReplicated), Sub: fmt.Sprintf("%d repaired", rp.Done)},
	}})
	v.Sections = append(v.Sections, Section{ID: "servers", Title: "Servers", Table: t})
	pt := &Table{ID: "pools", Head: []string{"pool", "replicas"}}
	for _, p := range st.Pools {
		pt.Rows = append(pt.Rows, []Cell{txt(p.Name), txt(count(int64(p.Replicas)))})
	}
	v.Sections = append(v.Sections, Section{ID: "pools", Title: "Pools", Table: pt})
}

// maxScan bounds the sessions read to count them.
const maxScan = 100000

func (c *Console) sessionsView(ctx context.Context, v *View, id string) {
	v.Search = &Search{Value: id}
	var all []api.Session
	after, truncated := "", false
	for {
		page, err := c.src.Sessions(ctx, after, 1000)
		if err != nil {
			v.Banners = append(v.Banners, Banner{Level: "error", Text: "sessions: " + err.Error()})
			break
		}
		all = append(all, page...)
		if len(page) < 1000 {
			break
		}
		if len(all) >= maxScan {
			truncated = true
			break
		}
		after = page[len(page)-1].ID
	}
	var bytesAll int64
	for _, s := range all {
		bytesAll += s.Bytes
	}
	ps := c.src.Plans()
	ss := c.snapshot()
	// Plan rates over the kept samples, and the current figure since the last one.
	var from, to time.Time
	var plans, prompt, cached float64
	var rateS, hitS []point
	for i := 1; i < len(ss); i++ {
		a, b := ss[i-1].Plans, ss[i].Plans
		sec := ss[i].At.Sub(ss[i-1].At).Seconds()
		if sec <= 0 || b.Plans < a.Plans {
			continue
		}
		if from.IsZero() {
			from = ss[i-1].At
		}
		to = ss[i].At
		dp, dpr, dc := float64(b.Plans-a.Plans), float64(b.PromptTokens-a.PromptTokens), float64(b.CachedTokens-a.CachedTokens)
		plans, prompt, cached = plans+dp, prompt+dpr, cached+dc
		rateS = append(rateS, point{ss[i].At, dp / sec})
		hitS = append(hitS, point{ss[i].At, 100 * div(dc, dpr)})
	}
	secs := to.Sub(from).Seconds()
	window := "last " + span(to.Sub(from))
	count0 := count(int64(len(all)))
	if truncated {
		count0 = "≥ " + count0
	}
	quota, meter := "no quota", (*float64)(nil)
	if ps.Quota > 0 {
		quota, meter = "quota "+size(ps.Quota), frac(bytesAll, ps.Quota)
	}
	v.Sections = append(v.Sections, Section{ID: "sessions-overview", Title: "Sessions", Stats: []Stat{
		{ID: "sessions-count", Label: "sessions", Value: count0},
		{ID: "sessions-bytes", Label: "KV bytes", Value: size(bytesAll), Sub: quota, Meter: meter},
		{ID: "plans-rate", Label: "plans/s", Value: rate(div(plans, secs)), Sub: window},
		{ID: "plans-hit", Label: "plan hit rate", Value: ratio(div(cached, prompt)), Sub: "since start " + ratio(div(float64(ps.CachedTokens), float64(ps.PromptTokens)))},
		{ID: "plans-total", Label: "plans since start", Value: count(ps.Plans)},
		{ID: "evictions", Label: "evictions since start", Value: count(ps.Evictions)},
	}, Charts: []Chart{
		mkChart("plans-rate-chart", "Plans per second", "/s", 0, from, to, []string{"plans"}, [][]point{rateS}, rate),
		mkChart("plans-hit-chart", "Plan hit rate (cached / prompt tokens)", "%", 100, from, to, []string{"hit rate"}, [][]point{hitS}, trimFloat),
	}})

	if id != "" {
		c.sessionDetail(ctx, v, id)
	}

	et := &Table{ID: "evictions", Head: []string{"session", "evicted"}, Empty: "no session evicted since the master started"}
	for i := len(ps.Recent) - 1; i >= 0; i-- {
		e := ps.Recent[i]
		et.Rows = append(et.Rows, []Cell{{Text: e.Session, Href: sessionHref(e.Session)}, {Text: ago(e.At), Title: e.At.UTC().Format(time.RFC3339)}})
	}
	v.Sections = append(v.Sections, Section{ID: "recent-evictions", Title: "Most recent evictions", Table: et})

	sort.SliceStable(all, func(i, j int) bool { return all[i].LastUsed.After(all[j].LastUsed) })
	st := &Table{ID: "session-list", Head: []string{"session", "model", "tokens", "bytes", "last used", "created"}, Empty: "no sessions"}
	for i, s := range all {
		if i == 50 {
			break
		}
		st.Rows = append(st.Rows, []Cell{{Text: s.ID, Href: sessionHref(s.ID)}, txt(s.Model), txt(count(s.Tokens)), txt(size(s.Bytes)),
			{Text: ago(s.LastUsed), Title: s.LastUsed.UTC().Format(time.RFC3339)}, {Text: s.Created.UTC().Format("2006-01-02 15:04:05")}})
	}
	v.Sections = append(v.Sections, Section{ID: "sessions-recent", Title: "Most recently used sessions (50 at most)", Table: st})
}

func sessionHref(id string) string { return "/ui/sessions?" + url.Values{"id": {id}}.Encode() }

func (c *Console) sessionDetail(ctx context.Context, v *View, id string) {
	s, err := c.src.Session(ctx, id)
	if err != nil {
		v.Sections = append(v.Sections, Section{ID: "session", Title: "Session " + id, Note: err.Error()})
		return
	}
	total := s.Tokens
	for _, r := range s.Ranges {
		total = max(total, r.TokenStart+r.TokenLength)
	}
	bar := &Bar{ID: "session-bar", Axis: fmt.Sprintf("tokens 0 – %d", total)}
	rt := &Table{ID: "session-ranges", Head: []string{"tokens", "length", "file", "bytes at", "bytes"}, Empty: "no committed ranges"}
	files := map[string]int{}
	for _, r := range s.Ranges {
		k, ok := files[r.KVURI]
		if !ok {
			k = len(files)
			files[r.KVURI] = k
		}
		if total > 0 {
			bar.Rects = append(bar.Rects, Rect{X: pctOf(r.TokenStart, total), W: pctOf(r.TokenLength, total), Class: fmt.Sprintf("f%d", k%4),
				Title: fmt.Sprintf("tokens %d–%d in %s", r.TokenStart, r.TokenStart+r.TokenLength, r.KVURI)})
		}
		rt.Rows = append(rt.Rows, []Cell{txt(fmt.Sprintf("%d – %d", r.TokenStart, r.TokenStart+r.TokenLength)), txt(count(r.TokenLength)),
			txt(r.KVURI), txt(count(r.KVStart)), txt(size(r.KVLength))})
	}
	var committed int64
	for _, r := range s.Ranges {
		committed += r.KVLength
	}
	filesSub := "holding committed ranges"
	if s.Bytes > committed {
		filesSub += "; " + size(s.Bytes-committed) + " more reserved by plans not committed (they expire)"
	}
	v.Sections = append(v.Sections, Section{ID: "session", Title: "Session " + s.ID, Stats: []Stat{
		{ID: "session-model", Label: "model", Value: s.Model},
		{ID: "session-tokens", Label: "tokens", Value: count(s.Tokens)},
		{ID: "session-bytes", Label: "bytes owned", Value: size(s.Bytes), Sub: size(committed) + " committed"},
		{ID: "session-files", Label: "files", Value: count(int64(len(files))), Sub: filesSub},
		{ID: "session-used", Label: "last used", Value: ago(s.LastUsed)},
	}, Bar: bar, Table: rt})
}

func pctOf(n, total int64) float64 { return math.Round(float64(n)/float64(total)*10000) / 100 }

func (c *Console) modelsView(ctx context.Context, v *View, st api.Status) {
	ms, err := c.modelFiles(ctx)
	if err != nil {
		v.Banners = append(v.Banners, Banner{Level: "error", Text: "models: " + err.Error()})
	}
	var served, cold int64
	for _, s := range st.Servers {
		served += s.ServedBytes
		cold += s.ColdBytes
	}
	var total, warm int64
	models := map[string]bool{}
	t := &Table{ID: "model-files", Head: []string{"model", "file", "size", "state", "kind", "warm on servers", "sha256", "source"},
		Empty: "no linked or pulled model files (gd2fs model link / gd2fs model pull)"}
	for _, f := range ms.Files {
		models[f.Model] = true
		total += f.Size
		warm += f.Warm
		state := "complete"
		switch {
		case !f.Sealed:
			state = "incomplete (pull in progress or interrupted)"
		case f.SHA256 != "":
			state = "verified"
		}
		kind := Cell{Text: "pulled", Title: "copied into the cluster by gd2fs model pull"}
		if f.Linked {
			kind = Cell{Text: "linked", Title: "gd2fs model link: S3 keeps the bytes; servers fill chunks on first read"}
		}
		w := Cell{Text: size(f.Warm)}
		if f.WarmUnknown {
			w = Cell{Text: "not checked", Class: "muted"}
		} else if f.Size > 0 {
			w.Text += " (" + ratio(float64(f.Warm)/float64(f.Size)) + ")"
		}
		sum := Cell{Text: "–", Class: "muted"}
		if f.SHA256 != "" {
			sum = Cell{Text: shortHash(f.SHA256), Title: f.SHA256, Class: "mono"}
		}
		t.Rows = append(t.Rows, []Cell{txt(f.Model), {Text: strings.TrimPrefix(f.Path, strings.TrimSuffix(f.Model, "/")+"/"), Title: f.Path},
			txt(size(f.Size)), txt(state), kind, w, sum, txt(f.Source)})
	}
	note := "Warm bytes are the chunks a live server holds (in DRAM or on disk), checked every 10s at most; S3 figures are what " +
		"servers fetched to fill chunks of linked files, per server, since they started (per-file figures are not kept). " +
		"Warmup cache hit ratios: clients measure them in their own cache (gd2fs cache ls, gd2fs status --cache) and do not " +
		"report them to the master, so this page cannot show them."
	if ms.Truncated {
		note = "The namespace walk or the chunk checks stopped early: some files or warm figures are missing. " + note
	}
	warmHit := "–"
	if served > 0 {
		warmHit = ratio(1 - float64(cold)/float64(served))
	}
	v.Sections = append(v.Sections, Section{ID: "models-overview", Title: "Models", Note: note, Stats: []Stat{
		{ID: "models-count", Label: "models", Value: count(int64(len(models))), Sub: count(int64(len(ms.Files))) + " files"},
		{ID: "models-bytes", Label: "size", Value: size(total)},
		{ID: "models-warm", Label: "warm on servers", Value: size(warm), Meter: frac(warm, total)},
		{ID: "models-s3", Label: "fetched from S3", Value: size(cold), Sub: "by servers, since they started"},
		{ID: "models-served", Label: "served by servers", Value: size(served), Sub: "warm hit ratio " + warmHit},
		{ID: "models-client-hit", Label: "client warmup hit ratio", Value: "not reported", Sub: "clients keep it locally"},
	}})
	v.Sections = append(v.Sections, Section{ID: "model-files", Title: "Files", Table: t})
	s3t := &Table{ID: "models-s3-servers", Head: []string{"server", "state", "served", "from S3"}}
	for _, s := range st.Servers {
		s3t.Rows = append(s3t.Rows, []Cell{txt(s.ID), {Text: s.State, Class: "state-" + s.State}, txt(size(s.ServedBytes)), txt(size(s.ColdBytes))})
	}
	v.Sections = append(v.Sections, Section{ID: "models-s3", Title: "S3 fetches per server", Table: s3t})
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}
