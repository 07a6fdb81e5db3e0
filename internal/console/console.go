// Package console is the master's web console: four pages (Cluster, KV
// cache, Sessions, Models) served at /ui/ on the master's port, rendered with
// html/template from embedded files, refreshed in place by a small script
// that fetches the same view as JSON (/ui/api/<page>).
//
// The console reads the master through Source, a small interface the master
// implements; it keeps a few minutes of samples of what servers report in
// heartbeats (Run) and turns them into rates, ratios and latency
// percentiles. It needs no external database and no Node build: the charts
// are inline SVG computed here.
//
// Access: with a cluster token set, a page asks for it once (login form, or
// ?token= in a URL) and then sets an HttpOnly, SameSite=Strict cookie that
// holds an HMAC of the token, never the token itself. The JSON views also
// accept the API's "Authorization: Bearer <token>" header.
package console

import (
	"context"
	"github.com/gd2fs/gd2fs/internal/authlimit"
	"log/slog"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
)

// Source is what the console reads; the master implements it.
type Source interface {
	Status(ctx context.Context) (api.Status, error)
	// Leader reports whether this master leads, and the leader's URL.
	Leader(ctx context.Context) (leads bool, leaderURL string)
	Plans() PlanStats
	Sessions(ctx context.Context, after string, limit int) ([]api.Session, error)
	Session(ctx context.Context, id string) (api.Session, error)
	Repairs(ctx context.Context) (Repairs, error)
	Models(ctx context.Context) (Models, error)
}

// PlanStats counts session plans since the master started.
type PlanStats struct {
	Plans        int64
	PromptTokens int64
	CachedTokens int64
	Evictions    int64
	Quota        int64      // session quota in bytes, 0: none
	Recent       []Eviction // most recent evictions, newest last
}

// Eviction is one session evicted to keep session files within the quota.
type Eviction struct {
	Session string
	At      time.Time
}

// Repairs is the state of HA re-replication.
type Repairs struct {
	UnderReplicated int64         // HA chunks with a replica on a down server
	Done, Failed    int64         // chunk copies since the master started
	After           time.Duration // how long a server is down before repair (<0: never)
}

// Models is the files model link and model pull made.
type Models struct {
	Files     []ModelFile
	Truncated bool // the walk or the chunk checks stopped early
}

// ModelFile is one linked or pulled file.
type ModelFile struct {
	Model       string // parent directory
	Path        string
	Size        int64
	Sealed      bool
	Source      string // s3://bucket/key
	SHA256      string
	Linked      bool  // made by model link: S3 keeps the bytes (else pulled: copied in)
	Warm        int64 // bytes of chunks a live server holds
	WarmUnknown bool  // not checked (too many chunks this round)
	FileID      int64 `json:"-"`
}

// Config configures a console.
type Config struct {
	Source   Source
	Token    string        // cluster token; "" serves anyone
	Interval time.Duration // between samples (default 5s)
	Keep     int           // samples kept (default 60: five minutes at 5s)
	Log      *slog.Logger
}

// Console serves the pages and keeps the samples.
type Console struct {
	cfg     Config
	src     Source
	logins  logins             // log-ins and their cookies (sessions.go)
	guesses *authlimit.Limiter // wrong tokens by address (log-in form, ?token=)

	mu      sync.Mutex
	samples []sample // oldest first

	modelsMu sync.Mutex // one models walk at a time; cached briefly
	models   Models
	modelsAt time.Time
	modelErr error
}

// sample is what the servers reported at one instant.
type sample struct {
	At      time.Time
	Servers []api.ServerInfo
	Plans   PlanStats
}

// New makes a console; Run samples, Handler serves.
func New(cfg Config) *Console {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Keep <= 1 {
		cfg.Keep = 60
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Console{cfg: cfg, src: cfg.Source, guesses: authlimit.New("console", cfg.Log)}
}

// Run takes a sample every Interval until ctx ends.
func (c *Console) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if err := c.Sample(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Log.Debug("console sample", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample records the servers' figures now. A standby has no live figures
// and records nothing.
func (c *Console) Sample(ctx context.Context) error {
	if leads, _ := c.src.Leader(ctx); !leads {
		return nil
	}
	st, err := c.src.Status(ctx)
	if err != nil {
		return err
	}
	s := sample{At: time.Now(), Servers: st.Servers, Plans: c.src.Plans()}
	s.Plans.Recent = nil
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples = append(c.samples, s)
	if n := len(c.samples) - c.cfg.Keep; n > 0 {
		c.samples = append(c.samples[:0], c.samples[n:]...)
	}
	return nil
}

func (c *Console) snapshot() []sample {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sample(nil), c.samples...)
}

// modelFiles walks for model files at most every 10s: the walk asks every
// server about every chunk.
func (c *Console) modelFiles(ctx context.Context) (Models, error) {
	c.modelsMu.Lock()
	defer c.modelsMu.Unlock()
	if time.Since(c.modelsAt) < 10*time.Second {
		return c.models, c.modelErr
	}
	c.models, c.modelErr = c.src.Models(ctx)
	c.modelsAt = time.Now()
	return c.models, c.modelErr
}
