package master

import (
	"context"
	"errors"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/console"
	dto "github.com/prometheus/client_model/go"
)

// The web console (package console) reads the master through consoleSource;
// the master records the few figures only it sees (plans and evictions).

// Console is the master's web console, served at /ui/ (for tests that take
// a sample on demand).
func (m *Master) Console() *console.Console { return m.console }

func (m *Master) newConsole() *console.Console {
	return console.New(console.Config{Source: consoleSource{m}, Token: m.cfg.Token, Log: m.log})
}

// planStats counts plans and evictions since the master started.
type planStats struct {
	mu     sync.Mutex
	st     console.PlanStats
	recent []console.Eviction // newest last, at most maxRecent
}

const maxRecent = 50

func (p *planStats) record(prompt, cached int64, evicted []string) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st.Plans++
	p.st.PromptTokens += prompt
	p.st.CachedTokens += cached
	p.st.Evictions += int64(len(evicted))
	for _, id := range evicted {
		p.recent = append(p.recent, console.Eviction{Session: id, At: now})
	}
	if n := len(p.recent) - maxRecent; n > 0 {
		p.recent = append(p.recent[:0], p.recent[n:]...)
	}
}

type consoleSource struct{ m *Master }

func (s consoleSource) Status(ctx context.Context) (api.Status, error) { return s.m.status(ctx) }

func (s consoleSource) Leader(ctx context.Context) (bool, string) {
	if s.m.leader.Load() {
		return true, s.m.url
	}
	l, _ := s.m.meta.Leader(ctx)
	return false, l
}

func (s consoleSource) Plans() console.PlanStats {
	p := &s.m.plans
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.st
	out.Quota = s.m.cfg.SessionQuota
	out.Recent = append([]console.Eviction(nil), p.recent...)
	return out
}

func (s consoleSource) Sessions(ctx context.Context, after string, limit int) ([]api.Session, error) {
	ss, err := s.m.meta.Sessions(ctx, after, limit)
	out := make([]api.Session, 0, len(ss))
	for _, x := range ss {
		out = append(out, s.m.sessionOut(x))
	}
	return out, err
}

func (s consoleSource) Session(ctx context.Context, id string) (api.Session, error) {
	x, err := s.m.meta.Session(ctx, id)
	return s.m.sessionOut(x), err
}

// Repairs counts HA chunks with a replica on a down server, and the
// re-replications done since the master started.
func (s consoleSource) Repairs(ctx context.Context) (console.Repairs, error) {
	var out console.Repairs
	m := s.m
	m.mu.Lock()
	var down []string
	for id, sv := range m.servers {
		if !sv.up {
			down = append(down, id)
		}
	}
	m.mu.Unlock()
	sort.Strings(down)
	ps, err := m.meta.Pools(ctx)
	if err != nil {
		return out, err
	}
	reps := map[string]int{}
	for _, p := range ps {
		reps[p.Name] = p.Replicas
	}
	for _, id := range down {
		cs, err := m.meta.ChunksOn(ctx, id)
		if err != nil {
			return out, err
		}
		for _, c := range cs {
			if reps[c.Pool] >= 2 {
				out.UnderReplicated++
			}
		}
	}
	out.After = m.cfg.RepairAfter
	for _, o := range []string{"ok", "failed"} {
		var d dto.Metric
		if m.metrics.repairs.WithLabelValues(o).Write(&d) == nil && d.Counter != nil {
			if o == "ok" {
				out.Done = int64(d.Counter.GetValue())
			} else {
				out.Failed = int64(d.Counter.GetValue())
			}
		}
	}
	return out, nil
}

// Models walks the namespace (skipping session KV files) for files with a
// cold source or a recorded sha256 -- what model link and model pull make --
// and checks which of their chunks are on a live server. It stops after
// maxEntries names and maxChunks chunk checks, and says so.
func (s consoleSource) Models(ctx context.Context) (console.Models, error) {
	const maxEntries, maxChunks = 20000, 4096
	m := s.m
	var out console.Models
	dirs, seen := []string{"/"}, 0
	for len(dirs) > 0 && seen < maxEntries {
		dir := dirs[0]
		dirs = dirs[1:]
		es, err := m.meta.List(ctx, dir)
		if errors.Is(err, errs.ErrNotFound) {
			continue // removed while we walked
		} else if err != nil {
			return out, err
		}
		for _, e := range es {
			seen++
			if e.IsDir {
				if e.Path != sessionDir {
					dirs = append(dirs, e.Path)
				}
				continue
			}
			attrs, err := m.meta.Attrs(ctx, e.Path)
			if err != nil || (attrs["source"] == "" && attrs["sha256"] == "") {
				continue
			}
			out.Files = append(out.Files, console.ModelFile{Model: path.Dir(e.Path), Path: e.Path, Size: e.File.Size,
				Sealed: e.File.Sealed, Source: attrs["source"], SHA256: attrs["sha256"], Linked: attrs["linked"] != "", FileID: e.File.ID})
		}
	}
	out.Truncated = len(dirs) > 0
	checked := 0
	for i := range out.Files {
		f := &out.Files[i]
		cs, err := m.meta.Chunks(ctx, f.FileID)
		if err != nil {
			return out, err
		}
		if checked+len(cs) > maxChunks {
			f.WarmUnknown = true
			out.Truncated = true
			continue
		}
		checked += len(cs)
		f.Warm = s.warmBytes(ctx, m.chunksOut(cs))
	}
	return out, nil
}

// warmBytes sums the lengths of chunks some live replica holds, asking the
// servers eight at a time.
func (s consoleSource) warmBytes(ctx context.Context, cs []api.Chunk) int64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	var warm int64
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			for _, r := range c.Replicas {
				if !r.Up {
					continue
				}
				if n, _, err := s.m.peers.StatChunk(ctx, r.Addr, c.ID); err == nil && n > 0 {
					mu.Lock()
					warm += min(n, c.Length)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return warm
}
