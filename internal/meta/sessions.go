package meta

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/kvlayout"
)

// Explicit-mode KV cache (DESIGN.md §3 Session, §6): model layouts, shared
// prefixes, sessions as ordered token ranges backed by byte ranges of files,
// and plans that reserve where new KV goes. Every operation is one SQL
// transaction, so two plans never overlap and a plan never names bytes that
// an eviction removed.

// Layout describes how a model's KV is laid out in bytes (kvlayout.Layout,
// the one layout type).
type Layout = kvlayout.Layout

// DTypeSize is the size in bytes of one element of dtype, or 0 if unknown.
func DTypeSize(dtype string) int { return kvlayout.DTypeSize(dtype) }

// Prefix is a registered shared prefix: a file holding the KV of Tokens tokens.
type Prefix struct {
	Path   string `json:"path"`
	Model  string `json:"model"`
	Tokens int64  `json:"tokens"`
	// TokenIDs are the ids the prefix's KV was computed from (Tokens of
	// them): a session created with the prefix then holds their block
	// hashes, so checked plans use the prefix. Without them the prefix's
	// tokens are stored but never vouched for (docs/kv-cache.md).
	TokenIDs []uint32 `json:"token_ids,omitempty"`
}

// Range is a run of tokens and the bytes that hold their KV.
type Range struct {
	TokenStart  int64  `json:"token_start"`
	TokenLength int64  `json:"token_length"`
	Path        string `json:"path"`
	KVStart     int64  `json:"kv_start"`
	KVLength    int64  `json:"kv_length"`
}

// Session is a session's metadata and its committed ranges in token order.
type Session struct {
	ID       string    `json:"id"`
	Model    string    `json:"model"`
	Tokens   int64     `json:"tokens"`
	Bytes    int64     `json:"bytes"` // bytes of files this session owns
	LastUsed time.Time `json:"last_used"`
	Created  time.Time `json:"created"`
	Ranges   []Range   `json:"ranges,omitempty"`
	// HashedTokens: how many leading tokens the session's block hashes
	// vouch for (content.go); checked plans use no stored token past it.
	HashedTokens int64 `json:"hashed_tokens"`
}

// PlanInput asks for a plan.
type PlanInput struct {
	Session      string
	Model        string
	Prefixes     []string // applied when the session is created
	PromptTokens int64
	// The prompt's content, so that stored KV is used only for the tokens
	// it was computed from (content.go): its token ids, or its block hashes
	// (kvlayout.BlockHashes in the layout's page_tokens). One of the two,
	// unless UnsafeCountOnly plans on token counts alone, as before the
	// content check: wrong KV after a user edits an earlier message.
	TokenIDs        []uint32
	BlockHashes     []BlockHash
	UnsafeCountOnly bool
	DecodeTokens    int64
	NewFile         bool // put the fresh range in a new file of the session
	// Aligned: plan in whole pages for an engine that loads and saves whole
	// blocks (storedAligned; the fresh range is rounded up to whole pages).
	Aligned   bool
	Dir       string // where session files live, e.g. /kv-sessions
	Pool      string // pool of session files
	ChunkSize int64
	Quota     int64 // bytes of session files allowed; 0 = no limit
	PlanTTL   time.Duration
	Now       time.Time
	// Place, when set, has the plan allocate the chunks under its fresh
	// range (placed by Place) and return them in FreshChunks, so the
	// engine writes with no master call (turns.go).
	Place PlaceFunc
	// Reachable says whether a data server is up; the stored part of the
	// plan ends before the first range with a chunk whose every replica is
	// on a server that is not (Plan.Shortened). nil: not checked.
	Reachable func(serverID string) bool
	// RequestID names the request: a plan repeated with the same id (a
	// connection cut, a failover to another master) while the first is
	// outstanding is answered with the first plan (Plan.Repeat).
	RequestID string
}

// Plan says which token ranges are stored and where the new KV goes, in
// namespace paths. It is the store's answer, not a wire type: the master
// turns it into api.Plan or api.EnginePlan (kv_uris in the requested format,
// the hit rate) in one place, internal/master/sessions.go.
type Plan struct {
	ID int64
	// Verified: how many leading prompt tokens the session's block hashes
	// vouched for (the prompt on counts alone); Cached <= Verified.
	Verified int64
	Stored   []Range
	Fresh    []Range
	Cached   int64
	Prefill  int64
	Decode   int64
	Load     int64
	Evicted  []string
	// FreshFile and FreshChunks: the fresh range's file and the chunks
	// holding its bytes, when the plan was asked to allocate them (Place).
	FreshFile   File
	FreshChunks []Chunk
	// Repeat: the answer to an earlier request with the same RequestID.
	Repeat bool `json:"-"`
	// Shortened says why the stored part ends before what the session
	// holds for the prompt ("server_down": bytes on a server that is down;
	// those ranges stay in the session until a commit replaces them), and
	// ShortenedTokens by how many tokens.
	Shortened       string
	ShortenedTokens int64
}

var sessionSchema = []string{
	`CREATE TABLE IF NOT EXISTS kv_layouts (model TEXT PRIMARY KEY, layers INTEGER NOT NULL, kv_heads INTEGER NOT NULL,
		head_dim INTEGER NOT NULL, dtype TEXT NOT NULL, page_tokens INTEGER NOT NULL, layout TEXT NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS kv_prefixes (path TEXT PRIMARY KEY, model TEXT NOT NULL, tokens BIGINT NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS kv_sessions (id TEXT PRIMARY KEY, model TEXT NOT NULL, tokens BIGINT NOT NULL,
		last_used BIGINT NOT NULL, created BIGINT NOT NULL, file_seq BIGINT NOT NULL)`, // file_seq: number of the session's current file, 0 = none yet
	// The quota's victim query (quotaVictimQuery) walks this index in its
	// order and stops at the first idle session. An index of last_used
	// alone left the id tie-break to a sort of the whole table on SQLite:
	// every evicting plan read every session (TestQuotaQueriesUseIndexes).
	`DROP INDEX IF EXISTS kv_sessions_lru`,
	`CREATE INDEX IF NOT EXISTS kv_sessions_lru_id ON kv_sessions (last_used, id)`,
	`CREATE TABLE IF NOT EXISTS kv_ranges (session_id TEXT NOT NULL, token_start BIGINT NOT NULL, token_length BIGINT NOT NULL,
		path TEXT NOT NULL, kv_start BIGINT NOT NULL, kv_length BIGINT NOT NULL, PRIMARY KEY (session_id, token_start))`,
	`CREATE INDEX IF NOT EXISTS kv_ranges_path ON kv_ranges (path)`,
	`CREATE TABLE IF NOT EXISTS kv_files (path TEXT PRIMARY KEY, session_id TEXT NOT NULL, reserved BIGINT NOT NULL)`,
	`CREATE INDEX IF NOT EXISTS kv_files_session ON kv_files (session_id)`,
	`CREATE TABLE IF NOT EXISTS kv_plans (id BIGINT PRIMARY KEY, session_id TEXT NOT NULL, token_start BIGINT NOT NULL,
		token_length BIGINT NOT NULL, path TEXT NOT NULL, kv_start BIGINT NOT NULL, kv_length BIGINT NOT NULL,
		base_tokens BIGINT NOT NULL, created BIGINT NOT NULL)`,
	`CREATE INDEX IF NOT EXISTS kv_plans_session ON kv_plans (session_id)`,
}

// lastUsedCol is, in a query of kv_sessions, the latest created of the
// session's outstanding plans (0 if none). A session's last use is the
// later of this and its last_used column: a plan writes no last_used of its
// own (its row says when it was made), which spares the write-behind flush
// the session's row and LRU index entry a turn; its commit writes
// last_used, and so does an expiry that deletes it (expirePlansTx). The
// quota's victim query needs no plans: it never picks a session with one
// outstanding.
const lastUsedCol = `(SELECT COALESCE(MAX(created), 0) FROM kv_plans WHERE session_id = kv_sessions.id)`

// The quota's two queries (enforceQuotaTx); TestQuotaQueriesUseIndexes
// checks that neither reads a whole table, whatever the sessions.
const (
	quotaTotalQuery  = `SELECT v FROM counters WHERE k = 'kv_reserved'`
	quotaVictimQuery = `SELECT id FROM kv_sessions WHERE id <> ? AND id NOT IN (SELECT session_id FROM kv_plans)
			ORDER BY last_used, id LIMIT 1`
)

// sessionColumns are columns added after the first release of the session
// tables; migrate adds them to databases made before.
var sessionColumns = []struct{ table, column, ddl string }{
	// version counts a session's commits: a plan commits only if none came
	// between (token counts alone can come back to the same value after a
	// rewind, with other tokens behind them).
	{"kv_sessions", "version", "BIGINT NOT NULL DEFAULT 0"},
	{"kv_plans", "base_version", "BIGINT NOT NULL DEFAULT -1"},
	{"kv_layouts", "tp_size", "INTEGER NOT NULL DEFAULT 1"},
	{"kv_layouts", "replicated", "INTEGER NOT NULL DEFAULT 0"},
	{"kv_layouts", "kv_layers", "INTEGER NOT NULL DEFAULT 0"}, // 0: every layer holds KV
	// last_plan is the plan a session's last commit recorded, so a commit
	// repeated after a connection cut (the first one applied, its answer
	// lost) is recognised and answered as done.
	{"kv_sessions", "last_plan", "BIGINT NOT NULL DEFAULT 0"},
	// The content check (content.go): a session's block hashes (hex, back
	// to back) and the tokens they cover; a prefix's token ids (hex of
	// little-endian uint32s, '' when registered without them); what a plan
	// knew of its prompt: its hashes from block hash_from on and its
	// prompt tokens (planned_tokens, -1 for a plan on counts alone).
	// Sessions and plans made before have no hashes: nothing of them is
	// vouched for, so checked plans recompute them once.
	{"kv_sessions", "hashes", "TEXT NOT NULL DEFAULT ''"},
	{"kv_sessions", "hashed_tokens", "BIGINT NOT NULL DEFAULT 0"},
	{"kv_prefixes", "token_ids", "TEXT NOT NULL DEFAULT ''"},
	{"kv_plans", "hash_from", "BIGINT NOT NULL DEFAULT 0"},
	{"kv_plans", "hashes", "TEXT NOT NULL DEFAULT ''"},
	{"kv_plans", "planned_tokens", "BIGINT NOT NULL DEFAULT -1"},
	// split_at: where the plan cut its fresh range in two (freshSplit; 0:
	// not cut); token_length and kv_length are those of both parts.
	{"kv_plans", "split_at", "BIGINT NOT NULL DEFAULT 0"},
	// Plans and forks safe to repeat (issue 29): a plan's request id and
	// its answer (JSON of Plan), so a repeat after a cut or a failover gets
	// the same plan, not a second reservation; a fork's request id on the
	// session it made, so a repeat is answered as done.
	{"kv_plans", "request_id", "TEXT NOT NULL DEFAULT ''"},
	{"kv_plans", "answer", "TEXT NOT NULL DEFAULT ''"},
	{"kv_sessions", "fork_request", "TEXT NOT NULL DEFAULT ''"},
	// lead_term: the lead term of the store that created a session file
	// (0: a store that did not lead). A store appends only to files of its
	// own term: a leader answering from memory may have handed out bytes
	// past what SQL says is reserved (writebehind.go).
	{"kv_files", "lead_term", "BIGINT NOT NULL DEFAULT 0"},
}

// lockSessionsSQL takes the sessions lock until the transaction ends.
const lockSessionsSQL = `SELECT pg_advisory_xact_lock(hashtext(current_schema()), $1)`

// lockSessions serialises the transactions that change sessions on
// PostgreSQL (SQLite runs one transaction at a time anyway). Plans, commits,
// quota evictions and deletions read several sessions' rows and files and
// write others; under READ COMMITTED, two of them at once could evict a
// session whose new file the other has just made, or deadlock on each
// other's rows.
//
// The transactions that add or remove names (CreateFile, Mkdir, RemoveDir,
// Rename, RemoveFile), and SetAttrs (attributes are kept by path), take it
// too, first: each checks that a name is free
// (or a directory empty) in one table and then writes another, and under
// READ COMMITTED a create and a mkdir of one path both passed their checks
// and made a file and a directory there, and a create in a directory
// raced its removal and left a file in no directory (TestNamespaceRaces).
// Creates were one at a time already (the next_id counter's row lock); now
// they also wait for a session flush in progress.
func (s *sqlStore) lockSessions(ctx context.Context, tx *sql.Tx) error {
	if !s.postgres {
		return nil
	}
	_, err := tx.ExecContext(ctx, lockSessionsSQL, sessionsLockKey)
	return wrapDB(err)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *sqlStore) PutLayout(ctx context.Context, l Layout) error {
	if err := checkModelName(l.Model); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	l.TPSize = max(l.TPSize, 1)
	// Session tables change only in group transactions (cache.go).
	caller := ctx
	ctx = context.WithoutCancel(ctx)
	return s.groupTx(caller, func(tx *sql.Tx) error {
		s.cache.journal.layouts = append(s.cache.journal.layouts, l.Model)
		delete(s.cache.layouts, l.Model)
		// Stored KV is only meaningful in the layout it was written with.
		old, err := s.layoutTx(ctx, tx, l.Model)
		if err == nil && old != l {
			var n int64
			if err := tx.QueryRowContext(ctx, s.q(`SELECT (SELECT COUNT(*) FROM kv_sessions WHERE model = ?) + (SELECT COUNT(*) FROM kv_prefixes WHERE model = ?)`),
				l.Model, l.Model).Scan(&n); err != nil {
				return wrapDB(err)
			}
			if n > 0 {
				return errs.New(errs.ErrExists, "model %s has %d sessions and prefixes stored in its current layout: delete them, or register the new layout under another model name", l.Model, n)
			}
		} else if err != nil && !errors.Is(err, errs.ErrNotFound) {
			return err
		}
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO kv_layouts (model, layers, kv_heads, head_dim, dtype, page_tokens, layout, tp_size, replicated, kv_layers)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (model) DO UPDATE SET layers = excluded.layers, kv_heads = excluded.kv_heads,
		head_dim = excluded.head_dim, dtype = excluded.dtype, page_tokens = excluded.page_tokens, layout = excluded.layout,
		tp_size = excluded.tp_size, replicated = excluded.replicated, kv_layers = excluded.kv_layers`),
			l.Model, l.Layers, l.KVHeads, l.HeadDim, l.DType, l.PageTokens, l.Order, l.TPSize, boolInt(l.Replicated), l.KVLayers)
		return wrapDB(err)
	})
}

func (s *sqlStore) layoutTx(ctx context.Context, x execer, model string) (Layout, error) {
	l := Layout{Model: model}
	var replicated int
	err := x.QueryRowContext(ctx, s.q(`SELECT layers, kv_heads, head_dim, dtype, page_tokens, layout, tp_size, replicated, kv_layers FROM kv_layouts WHERE model = ?`), model).
		Scan(&l.Layers, &l.KVHeads, &l.HeadDim, &l.DType, &l.PageTokens, &l.Order, &l.TPSize, &replicated, &l.KVLayers)
	l.Replicated = replicated != 0
	if errors.Is(err, sql.ErrNoRows) {
		return l, errs.New(errs.ErrNotFound, "no KV layout for model %q: register one with 'gd2fs model layout set %s ...'", model, model)
	}
	return l, wrapDB(err)
}

func (s *sqlStore) Layout(ctx context.Context, model string) (Layout, error) {
	if err := checkText("model name", model); err != nil {
		return Layout{}, err
	}
	return s.layoutTx(ctx, s.db, model)
}

func (s *sqlStore) PutPrefix(ctx context.Context, p Prefix) error {
	if err := checkText("prefix", p.Path, p.Model); err != nil {
		return err
	}
	caller := ctx
	ctx = context.WithoutCancel(ctx)
	return s.groupTx(caller, func(tx *sql.Tx) error {
		l, err := s.layoutC(ctx, tx, p.Model)
		if err != nil {
			return err
		}
		if len(p.TokenIDs) > 0 && p.Tokens == 0 {
			p.Tokens = int64(len(p.TokenIDs))
		}
		if len(p.TokenIDs) > 0 && int64(len(p.TokenIDs)) != p.Tokens {
			return errs.New(errs.ErrBadRequest, "prefix %s: %d token ids for %d tokens; give the ids of every token (or leave tokens out)", p.Path, len(p.TokenIDs), p.Tokens)
		}
		if p.Tokens < 1 || checkTokens("prefix tokens", p.Tokens) != nil {
			return errs.New(errs.ErrBadRequest, "prefix %s: tokens must be between 1 and %d", p.Path, limits.MaxTokens)
		}
		f, err := s.fileBy(ctx, tx, "path", p.Path)
		if err != nil {
			return err
		}
		if want := l.RangeBytes(p.Tokens); f.Size != want {
			return errs.New(errs.ErrBadRequest, "prefix %s holds %d bytes, but %d tokens of %s take %d: write the whole KV first",
				p.Path, f.Size, p.Tokens, p.Model, want)
		}
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO kv_prefixes (path, model, tokens, token_ids) VALUES (?, ?, ?, ?)
			ON CONFLICT (path) DO UPDATE SET model = excluded.model, tokens = excluded.tokens, token_ids = excluded.token_ids`),
			p.Path, p.Model, p.Tokens, encodeIDs(p.TokenIDs))
		// A first plan that read the prefix before this must not make its
		// session in memory from the old row (writebehind.go, planFast).
		s.cache.absentGen++
		return wrapDB(err)
	})
}

func (s *sqlStore) rangesTx(ctx context.Context, x execer, id string) ([]Range, error) {
	rows, err := x.QueryContext(ctx, s.q(`SELECT token_start, token_length, path, kv_start, kv_length FROM kv_ranges
		WHERE session_id = ? ORDER BY token_start`), id)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	var out []Range
	for rows.Next() {
		var r Range
		if err := rows.Scan(&r.TokenStart, &r.TokenLength, &r.Path, &r.KVStart, &r.KVLength); err != nil {
			return nil, wrapDB(err)
		}
		out = append(out, r)
	}
	return out, wrapDB(rows.Err())
}

type sessionRow struct {
	model   string
	tokens  int64
	fileSeq int64
	version int64
	hashes  []BlockHash // content.go
	hashed  int64
}

func (s *sqlStore) sessionTx(ctx context.Context, x execer, id string) (sessionRow, bool, error) {
	var r sessionRow
	var hs string
	err := x.QueryRowContext(ctx, s.q(`SELECT model, tokens, file_seq, version, hashes, hashed_tokens FROM kv_sessions WHERE id = ?`), id).
		Scan(&r.model, &r.tokens, &r.fileSeq, &r.version, &hs, &r.hashed)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, wrapDB(err)
	}
	r.hashes, err = decodeHashes(hs)
	return r, err == nil, err
}

// promptOf checks what a plan says of its prompt's content against the
// layout and returns it, hashed; ok is false for a plan on counts alone.
func promptOf(in PlanInput, l Layout) (p prompt, ok bool, err error) {
	pt := int64(l.PageTokens)
	switch {
	case in.UnsafeCountOnly:
		return prompt{}, false, nil
	case len(in.TokenIDs) > 0:
		return prompt{n: in.PromptTokens, ids: in.TokenIDs, hashes: kvlayout.BlockHashes(in.TokenIDs, l.PageTokens)}, true, nil
	}
	if want := (in.PromptTokens + pt - 1) / pt; int64(len(in.BlockHashes)) != want {
		return prompt{}, false, errs.New(errs.ErrBadRequest, "%d block_hashes for a prompt of %d tokens: model %s has blocks of %d tokens, so want %d (the last of a partial block)",
			len(in.BlockHashes), in.PromptTokens, l.Model, pt, want)
	}
	return prompt{n: in.PromptTokens, hashes: in.BlockHashes}, true, nil
}

// PlanSession computes a plan and reserves the bytes for its fresh range.
func (s *sqlStore) PlanSession(ctx context.Context, in PlanInput) (Plan, error) {
	if err := checkSessionID(in.Session); err != nil {
		return Plan{}, err
	}
	if len(in.TokenIDs) > 0 && in.PromptTokens == 0 {
		in.PromptTokens = int64(len(in.TokenIDs))
	}
	if err := checkPlanInput(in); err != nil {
		return Plan{}, err
	}
	if err := checkText("model name", in.Model); err != nil {
		return Plan{}, err
	}
	if err := ctx.Err(); err != nil {
		return Plan{}, err
	}
	if p, ok, err := s.planFast(ctx, in); ok { // writebehind.go
		return p, err
	}
	var p Plan
	// The caller's context decides whether the plan starts; once started
	// in its group transaction it runs to its end (groupcommit.go).
	caller := ctx
	ctx = context.WithoutCancel(ctx)
	err := s.groupTx(caller, func(tx *sql.Tx) error {
		p = Plan{}
		if err := s.lockSessions(ctx, tx); err != nil {
			return err
		}
		now := in.Now.UnixNano()
		if err := s.expirePlansC(ctx, tx, in.Dir, in.Now.Add(-in.PlanTTL).UnixNano()); err != nil { // plan_expiry.go
			return err
		}
		if in.RequestID != "" {
			var answer string
			var err error
			c := &s.cache
			if c.on && c.plansLoaded {
				err = sql.ErrNoRows
				if id, ok := c.byRequest[in.Session+"\x00"+in.RequestID]; ok {
					answer, err = c.plans[id].answer, nil
				}
			} else {
				err = tx.QueryRowContext(ctx, s.q(`SELECT answer FROM kv_plans WHERE session_id = ? AND request_id = ?`), in.Session, in.RequestID).Scan(&answer)
			}
			switch {
			case err == nil:
				if err := json.Unmarshal([]byte(answer), &p); err != nil {
					return errs.New(errs.ErrInternal, "stored answer of plan request %q: %v", in.RequestID, err)
				}
				p.Repeat = true
				return nil
			case !errors.Is(err, sql.ErrNoRows):
				return wrapDB(err)
			}
			// Not outstanding (never made, committed or expired): a new plan.
		}
		l, err := s.layoutC(ctx, tx, in.Model)
		if err != nil {
			return err
		}
		pr, checked, err := promptOf(in, l)
		if err != nil {
			return err
		}
		e, ok, err := s.sessionC(ctx, tx, in.Session) // cache.go
		if err != nil {
			return err
		}
		if ok && e.row.model != in.Model {
			return errs.New(errs.ErrBadRequest, "session %s holds KV of model %s, not %s", in.Session, e.row.model, in.Model)
		}
		if !ok {
			if e, err = s.createSessionTx(ctx, tx, in, l); err != nil {
				return err
			}
			s.cache.putSession(in.Session, e)
		}
		sess, ranges := e.row, e.ranges
		n, pt := in.PromptTokens, int64(l.PageTokens)
		end := planStored(&p, l, in, sess.hashes, sess.hashed, ranges, pr, checked)
		if in.Reachable != nil {
			if err := planReachable(&p, func(r Range) (bool, error) { return s.unreachableTx(ctx, tx, in.Reachable, r) }); err != nil {
				return err
			}
		}
		planCounts(&p, in)
		// The plan row remembers where its commit cuts the session (the
		// cached tokens) and the fresh range, if any.
		fr := Range{TokenStart: p.Cached}
		var split int64
		if fresh := end - p.Cached; fresh > 0 {
			if checked {
				split = freshSplit(pt, p.Cached, end, n, in.Aligned)
			}
			fr.TokenLength = fresh
			for _, part := range splitFresh(l, fr, split) {
				fr.KVLength += part.KVLength
			}
			// Fresh bytes go to servers that are up: not into the tail
			// chunk of a session file on a server that is down.
			if in.Reachable != nil && sess.fileSeq != 0 && !in.NewFile {
				if in.NewFile, err = s.tailDownTx(ctx, tx, in, sess); err != nil {
					return err
				}
			}
			if fr.Path, fr.KVStart, err = s.reserveTx(ctx, tx, in, &sess, fr.KVLength); err != nil {
				return err
			}
			if sess.fileSeq != e.row.fileSeq { // a new file
				n := *e
				n.row.fileSeq = sess.fileSeq
				s.cache.putSession(in.Session, &n)
			}
			p.Fresh = splitFresh(l, fr, split)
			if in.Place != nil {
				if p.FreshFile, p.FreshChunks, err = s.allocFreshTx(ctx, tx, in.Place, fr); err != nil {
					return err
				}
			}
		}
		if p.Evicted, err = s.enforceQuotaTx(ctx, tx, in); err != nil {
			return err
		}
		if p.ID, err = s.counter(ctx, tx, "next_id", 1); err != nil {
			return err
		}
		// What the commit records of the prompt: its hashes from the
		// block the cached tokens end in (those before it are the
		// session's own, verified equal).
		hashFrom, planned, hashes := p.Cached/pt, int64(-1), ""
		if checked {
			planned, hashes = n, encodeHashes(pr.hashes[hashFrom:])
		}
		// A plan with a request id keeps its answer, for a repeat.
		answer := ""
		if in.RequestID != "" {
			a, err := planAnswer(&p)
			if err != nil {
				return errs.New(errs.ErrInternal, "plan answer: %v", err)
			}
			answer = a
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO kv_plans (id, session_id, token_start, token_length, path, kv_start, kv_length, base_tokens, base_version, created,
			hash_from, hashes, planned_tokens, split_at, request_id, answer) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`), p.ID, in.Session, fr.TokenStart, fr.TokenLength, fr.Path, fr.KVStart, fr.KVLength,
			sess.tokens, sess.version, now, hashFrom, hashes, planned, split, in.RequestID, answer); err != nil {
			return wrapDB(err)
		}
		s.cache.addPlan(p.ID, &cachedPlan{session: in.Session, fr: fr, base: sess.version, hashFrom: hashFrom, hashes: hashes, planned: planned,
			split: split, requestID: in.RequestID, answer: answer, created: now})
		// No last_used update: the plan row's created is the session's
		// last use while it is outstanding (lastUsedCol).
		return s.afterSlowPlan(ctx, tx, in, p, fr.Path) // writebehind.go
	})
	return p, err
}

// unreachableTx reports whether some byte of r lies in a chunk whose every
// replica is on a server reachable says is not up. A chunk with no replica
// recorded is not judged (a linked file's chunks fill from the cold tier).
func (s *sqlStore) unreachableTx(ctx context.Context, tx *sql.Tx, reachable func(string) bool, r Range) (bool, error) {
	f, err := s.fileBy(ctx, tx, "path", r.Path)
	if err != nil {
		return false, err
	}
	if f.ChunkSize <= 0 || r.KVLength <= 0 {
		return false, nil
	}
	first, last := r.KVStart/f.ChunkSize, (r.KVStart+r.KVLength-1)/f.ChunkSize
	rows, err := tx.QueryContext(ctx, s.q(`SELECT c.idx, p.server_id FROM chunks c JOIN replicas p ON p.chunk_id = c.id
		WHERE c.file_id = ? AND c.idx >= ? AND c.idx <= ?`), f.ID, first, last)
	if err != nil {
		return false, wrapDB(err)
	}
	defer rows.Close()
	held, up := map[int64]bool{}, map[int64]bool{}
	for rows.Next() {
		var idx int64
		var server string
		if err := rows.Scan(&idx, &server); err != nil {
			return false, wrapDB(err)
		}
		held[idx] = true
		if reachable(server) {
			up[idx] = true
		}
	}
	if err := rows.Err(); err != nil {
		return false, wrapDB(err)
	}
	for idx := range held {
		if !up[idx] {
			return true, nil
		}
	}
	return false, nil
}

// tailDownTx reports whether the session's current file ends in a chunk
// whose every replica is on a server that is down, where a fresh range
// appended to it would begin.
func (s *sqlStore) tailDownTx(ctx context.Context, tx *sql.Tx, in PlanInput, sess sessionRow) (bool, error) {
	path := sessionFile(in.Dir, in.Session, sess.fileSeq)
	var reserved int64
	err := tx.QueryRowContext(ctx, s.q(`SELECT reserved FROM kv_files WHERE path = ?`), path).Scan(&reserved)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && reserved == 0) {
		return false, nil
	}
	if err != nil {
		return false, wrapDB(err)
	}
	return s.unreachableTx(ctx, tx, in.Reachable, Range{Path: path, KVStart: reserved - 1, KVLength: 1})
}

// createSessionTx creates a session whose first ranges are its prefixes
// (newSession).
func (s *sqlStore) createSessionTx(ctx context.Context, tx *sql.Tx, in PlanInput, l Layout) (*cachedSession, error) {
	rows, err := s.prefixRows(ctx, tx, in)
	if err != nil {
		return nil, err
	}
	e, err := newSession(in, l, rows)
	if err != nil {
		return nil, err
	}
	for _, r := range e.ranges {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO kv_ranges (session_id, token_start, token_length, path, kv_start, kv_length)
			VALUES (?, ?, ?, ?, 0, ?)`), in.Session, r.TokenStart, r.TokenLength, r.Path, r.KVLength); err != nil {
			return nil, wrapDB(err)
		}
	}
	now := in.Now.UnixNano()
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO kv_sessions (id, model, tokens, last_used, created, file_seq, hashes, hashed_tokens) VALUES (?, ?, ?, ?, ?, 0, ?, ?)`),
		in.Session, in.Model, e.row.tokens, now, now, encodeHashes(e.row.hashes), e.row.hashed); err != nil {
		return nil, wrapDB(err)
	}
	return e, nil
}

// prefixRows reads in.Prefixes' rows, in order: an error when one is not
// registered, or holds another model's KV.
func (s *sqlStore) prefixRows(ctx context.Context, x execer, in PlanInput) ([]prefixRow, error) {
	rows := make([]prefixRow, len(in.Prefixes))
	for i, path := range in.Prefixes {
		p := &rows[i]
		err := x.QueryRowContext(ctx, s.q(`SELECT model, tokens, token_ids FROM kv_prefixes WHERE path = ?`), path).Scan(&p.model, &p.tokens, &p.ids)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, errs.New(errs.ErrNotFound, "no registered prefix %s: register it with POST /v1/prefixes", path)
		}
		if err != nil {
			return nil, wrapDB(err)
		}
		if p.model != in.Model {
			return nil, errs.New(errs.ErrBadRequest, "prefix %s holds KV of model %s, not %s", path, p.model, in.Model)
		}
	}
	return rows, nil
}

// prefixRow is a registered prefix (kv_prefixes) as a new session starts
// from it: its model, tokens and token ids (hex, "" when registered
// without).
type prefixRow struct {
	model  string
	tokens int64
	ids    string
}

// newSession is a session made from prefixes (rows, in in.Prefixes'
// order) whose models were checked. Its ranges are the prefixes. Its
// hashes cover its first prefix when that was registered with its token
// ids, and nothing after it: a prefix file's KV was computed for its ids
// from position 0, so a second prefix's bytes are not the KV of its tokens
// after the first (they attend to nothing before them); it is stored, and
// a plan recomputes it.
func newSession(in PlanInput, l Layout, rows []prefixRow) (*cachedSession, error) {
	var tokens int64
	var ids []uint32
	var ranges []Range
	for i, p := range rows {
		if i == 0 && p.ids != "" {
			pids, err := decodeIDs(p.ids)
			if err != nil {
				return nil, err
			}
			ids = append(ids, pids...)
		}
		ranges = append(ranges, Range{TokenStart: tokens, TokenLength: p.tokens, Path: in.Prefixes[i], KVLength: l.RangeBytes(p.tokens)})
		tokens += p.tokens
	}
	hashes := kvlayout.BlockHashes(ids, l.PageTokens)
	return &cachedSession{row: sessionRow{model: in.Model, tokens: tokens, hashes: hashes, hashed: int64(len(ids))}, ranges: ranges}, nil
}

// reserveTx picks the file for a fresh range and reserves n bytes at its end.
func (s *sqlStore) reserveTx(ctx context.Context, tx *sql.Tx, in PlanInput, sess *sessionRow, n int64) (string, int64, error) {
	var term int64 // this store's lead term, 0 when it does not lead
	if s.cache.on {
		term = s.cache.term
	}
	if sess.fileSeq != 0 && !in.NewFile {
		// Only into a file of this store's term (writebehind.go): another
		// leader may have reserved past what SQL says, in memory.
		// Nor into a sealed file (a user's Close of it): a new file.
		var ft, sealed int64
		err := tx.QueryRowContext(ctx, s.q(`SELECT k.lead_term, COALESCE((SELECT f.sealed FROM files f WHERE f.path = k.path), 0) FROM kv_files k WHERE k.path = ?`),
			sessionFile(in.Dir, in.Session, sess.fileSeq)).Scan(&ft, &sealed)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return "", 0, wrapDB(err)
		}
		in.NewFile = err == nil && (ft != term || sealed != 0)
	}
	if sess.fileSeq == 0 || in.NewFile {
		// Numbers come from the global id counter, so a session deleted and
		// created again never collides with files a fork kept alive.
		n, err := s.counter(ctx, tx, "next_id", 1)
		if err != nil {
			return "", 0, err
		}
		sess.fileSeq = n
		path := sessionFile(in.Dir, in.Session, sess.fileSeq)
		if _, err := s.createFileTx(ctx, tx, File{Path: path, Pool: in.Pool, ChunkSize: in.ChunkSize, Modified: in.Now}); err != nil {
			return "", 0, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO kv_files (path, session_id, reserved, lead_term) VALUES (?, ?, 0, ?)`), path, in.Session, term); err != nil {
			return "", 0, wrapDB(err)
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE kv_sessions SET file_seq = ? WHERE id = ?`), sess.fileSeq, in.Session); err != nil {
			return "", 0, wrapDB(err)
		}
	}
	path := sessionFile(in.Dir, in.Session, sess.fileSeq)
	var end int64
	if err := tx.QueryRowContext(ctx, s.q(`UPDATE kv_files SET reserved = reserved + ? WHERE path = ? RETURNING reserved`), n, path).Scan(&end); err != nil {
		return "", 0, wrapDB(err)
	}
	if _, err := s.counter(ctx, tx, "kv_reserved", n); err != nil {
		return "", 0, err
	}
	return path, end - n, nil
}

func sessionFile(dir, id string, seq int64) string {
	return dir + "/" + id + "/kv-" + strconv.FormatInt(seq, 10)
}

// enforceQuotaTx evicts least recently used sessions (never the planning
// one, never one with a plan outstanding) until session files fit the quota.
func (s *sqlStore) enforceQuotaTx(ctx context.Context, tx *sql.Tx, in PlanInput) ([]string, error) {
	if in.Quota <= 0 {
		return nil, nil
	}
	var evicted []string
	for {
		var total int64
		if err := tx.QueryRowContext(ctx, quotaTotalQuery).Scan(&total); err != nil {
			return nil, wrapDB(err)
		}
		limit := in.Quota
		if len(evicted) > 0 && len(evicted) < lowMarkVictims {
			limit = quotaLow(in.Quota)
		}
		if total <= limit {
			return evicted, nil
		}
		var victim string
		err := tx.QueryRowContext(ctx, s.q(quotaVictimQuery), in.Session).Scan(&victim)
		if errors.Is(err, sql.ErrNoRows) && total <= in.Quota {
			return evicted, nil // under the quota, if not down to its low mark
		}
		if errors.Is(err, sql.ErrNoRows) {
			return nil, errs.New(errs.ErrNoSpace, "KV session quota of %d bytes is full (%d reserved) and no idle session can be evicted: raise --session-quota or delete sessions", in.Quota, total)
		}
		if err != nil {
			return nil, wrapDB(err)
		}
		if err := s.deleteSessionTx(ctx, tx, victim); err != nil {
			return nil, err
		}
		evicted = append(evicted, victim)
	}
}

// quotaLow is where an eviction stops: once a plan must evict, it evicts
// (least recently used first, as ever) until the reserved bytes are 1/32 of
// the quota below it, not just under it. A cache under its quota is full
// for good, and a plan that evicts runs in SQL (the LRU query, the victims'
// rows): evicting just enough sent every plan there, where the slack lets
// the next plans, 1/32 of the quota's worth, be answered from the leader's
// memory (docs/kv-cache.md, "Quota").
func quotaLow(quota int64) int64 { return quota - quota/32 }

// lowMarkVictims bounds the sessions one plan evicts on the way to the low
// mark once under the quota: every fast operation waits while the group
// transaction deletes them, and with small sessions 1/32 of a quota can be
// thousands of them.
const lowMarkVictims = 64

// deleteSessionTx removes a session; files it owns go when no other session
// (a fork) still references them, else pass to one that does.
func (s *sqlStore) deleteSessionTx(ctx context.Context, tx *sql.Tx, id string) error {
	s.cache.dropSession(id)
	for _, q := range []string{`DELETE FROM kv_ranges WHERE session_id = ?`, `DELETE FROM kv_plans WHERE session_id = ?`} {
		if _, err := tx.ExecContext(ctx, s.q(q), id); err != nil {
			return wrapDB(err)
		}
	}
	r, err := tx.ExecContext(ctx, s.q(`DELETE FROM kv_sessions WHERE id = ?`), id)
	if err != nil {
		return wrapDB(err)
	}
	if k, _ := r.RowsAffected(); k == 0 {
		return errs.New(errs.ErrNotFound, "no session %s", id)
	}
	paths, err := s.queryStrings(ctx, tx, `SELECT path FROM kv_files WHERE session_id = ?`, id)
	if err != nil {
		return err
	}
	s.cache.totalKnown = false
	for _, p := range paths {
		if s.cache.on {
			s.cache.journal.files = append(s.cache.journal.files, p)
			delete(s.cache.files, p)
		}
		var heir string
		err := tx.QueryRowContext(ctx, s.q(`SELECT session_id FROM kv_ranges WHERE path = ? LIMIT 1`), p).Scan(&heir)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if err := s.dropKVFileTx(ctx, tx, p); err != nil {
				return err
			}
			if err := s.removeFileTx(ctx, tx, p); err != nil && !errors.Is(err, errs.ErrNotFound) {
				return err
			}
			// The session's directory goes with its last file: plans made
			// it, and under a quota's churn of new session ids every
			// evicted session would otherwise leave a row in dirs for ever.
			d := parentOf(p)
			if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM dirs WHERE path = ? AND NOT EXISTS (SELECT 1 FROM files WHERE parent = ?)
				AND NOT EXISTS (SELECT 1 FROM dirs WHERE parent = ?)`), d, d, d); err != nil {
				return wrapDB(err)
			}
		case err != nil:
			return wrapDB(err)
		default:
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE kv_files SET session_id = ? WHERE path = ?`), heir, p); err != nil {
				return wrapDB(err)
			}
			if s.cache.on { // its bytes now count for the heir
				s.cache.touchSession(heir)
				s.cache.unload(heir)
			}
		}
	}
	return nil
}

// dropKVFileTx deletes session file p's row and takes its reservation off
// the total (kv_reserved).
func (s *sqlStore) dropKVFileTx(ctx context.Context, tx *sql.Tx, p string) error {
	var reserved int64
	err := tx.QueryRowContext(ctx, s.q(`DELETE FROM kv_files WHERE path = ? RETURNING reserved`), p).Scan(&reserved)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return wrapDB(err)
	}
	_, err = s.counter(ctx, tx, "kv_reserved", -reserved)
	return err
}

// addReservedCounter creates counters.kv_reserved, SUM(kv_files.reserved)
// kept by every statement that changes it, so that the quota check reads one
// row instead of summing every session file (quotaTotalQuery). A database
// made before it gets it counted once, when a master first opens it (at a
// million sessions a scan of seconds: done at Open, which has no deadline,
// not in Lead, which has one). A master of an earlier version still
// leading beside one of this version changes reservations without it; the
// invariants (GD2FS_META_INVARIANTS=1) check it after every transaction.
func (s *sqlStore) addReservedCounter(ctx context.Context, x execer) error {
	var n int
	if err := x.QueryRowContext(ctx, `SELECT COUNT(*) FROM counters WHERE k = 'kv_reserved'`).Scan(&n); err != nil || n > 0 {
		return err
	}
	_, err := x.ExecContext(ctx, `INSERT INTO counters (k, v) SELECT 'kv_reserved', COALESCE(SUM(reserved), 0) FROM kv_files`)
	return err
}

// CommitInput commits a plan.
type CommitInput struct {
	Session string
	// PlanID names the plan; 0 finds it by the first saved segment (the
	// plan whose fresh range starts at that segment's file and byte).
	PlanID int64
	// Partial: Saved is what the engine saved of the plan's fresh range,
	// perhaps less or nothing (checkSaved). Otherwise the whole fresh range
	// is committed.
	Partial bool
	Saved   []Range
	// Written: the client wrote the committed bytes into the chunks the
	// plan allocated (Plan.FreshChunks) and did not Sync; the commit
	// records their size itself (recordWrittenTx), in its own transaction.
	Written bool
	// Held, when set, is asked (inside the commit, after the saved
	// segments passed their checks) whether the servers hold every byte
	// of the ranges about to be recorded; its error refuses the commit
	// and nothing is recorded. The master answers it from what it asked
	// its servers before the transaction (internal/master/written.go).
	// With Held, a range past its file's recorded size is recorded as
	// Written's are (recordsWritten): the engine's Sync is not needed.
	Held func(l Layout, fresh []Range) error
	Now  time.Time
}

// recordsWritten says whether commit in records the size of ranges its
// file's recorded size does not reach (recordWrittenTx, writtenMem):
// with Written, or when the servers vouch for every byte of them (Held,
// which runs first and refuses a hole). Without either, such a range was
// not written as far as the store knows, and the commit is refused.
func recordsWritten(in CommitInput) bool { return in.Written || in.Held != nil }

// CommitSession records a plan as the session's new state: the session
// keeps the tokens the plan found cached and continues with the plan's fresh
// range, or with what the engine saved of it (afterCommit). The bytes must
// have been written — vouched for by the servers (Held), which the commit
// then records as a Sync would, or without Held covered by the file's
// committed size — and no other commit may have come between the plan and
// this one.
func (s *sqlStore) CommitSession(ctx context.Context, in CommitInput) (Session, error) {
	if err := checkText("session id", in.Session); err != nil {
		return Session{}, err
	}
	if err := ctx.Err(); err != nil {
		return Session{}, err
	}
	if out, ok, err := s.commitFast(in); ok { // writebehind.go
		return out, err
	}
	id, planID := in.Session, in.PlanID
	caller := ctx
	ctx = context.WithoutCancel(ctx)
	err := s.groupTx(caller, func(tx *sql.Tx) error {
		if err := s.lockSessions(ctx, tx); err != nil {
			return err
		}
		e, ok, err := s.sessionC(ctx, tx, id) // cache.go
		if err != nil {
			return err
		}
		if !ok {
			return errs.New(errs.ErrExists, "session %s is gone (evicted or deleted) since its plan: plan again", id)
		}
		sess := e.row
		if planID == 0 {
			if !in.Partial || len(in.Saved) == 0 {
				return errs.New(errs.ErrBadRequest, "commit of session %s names no plan_id and no saved segment: nothing to commit", id)
			}
			err := tx.QueryRowContext(ctx, s.q(`SELECT id FROM kv_plans WHERE session_id = ? AND path = ? AND kv_start = ?`),
				id, in.Saved[0].Path, in.Saved[0].KVStart).Scan(&planID)
			if errors.Is(err, sql.ErrNoRows) {
				// A repeat of a commit that was applied (its answer lost to a
				// cut): the session holds exactly the saved segments. Bytes
				// are never rewritten, so a segment belongs to one plan only.
				if holds(e.ranges, in.Saved) {
					return nil
				}
				return errs.New(errs.ErrNotFound, "no outstanding plan of session %s reserved %s at byte %d (plans expire, and commit once; was the session evicted?): plan again",
					id, in.Saved[0].Path, in.Saved[0].KVStart)
			}
			if err != nil {
				return wrapDB(err)
			}
		}
		var fr Range
		var base int64
		var sid string
		var pc planContent
		var planHashes string
		var split int64
		if err := s.loadPlans(ctx, tx); err != nil {
			return err
		}
		if c := &s.cache; c.on {
			err = sql.ErrNoRows
			if cp, ok := c.plans[planID]; ok {
				sid, fr, base, pc.from, planHashes, pc.planned, split, err = cp.session, cp.fr, cp.base, cp.hashFrom, cp.hashes, cp.planned, cp.split, nil
			}
		} else {
			err = tx.QueryRowContext(ctx, s.q(`SELECT session_id, token_start, token_length, path, kv_start, kv_length, base_version, hash_from, hashes, planned_tokens, split_at
			FROM kv_plans WHERE id = ?`), planID).
				Scan(&sid, &fr.TokenStart, &fr.TokenLength, &fr.Path, &fr.KVStart, &fr.KVLength, &base, &pc.from, &planHashes, &pc.planned, &split)
		}
		if errors.Is(err, sql.ErrNoRows) && e.lastPlan == planID {
			return nil // this very plan was the last commit: a repeat
		}
		if errors.Is(err, sql.ErrNoRows) || (err == nil && sid != id) {
			return errs.New(errs.ErrNotFound, "no outstanding plan %d for session %s (plans expire, and commit once; was the session evicted?): plan again", planID, id)
		}
		if err != nil {
			return wrapDB(err)
		}
		if sess.version != base {
			return errs.New(errs.ErrExists, "session %s changed since plan %d (another plan committed in between): plan again", id, planID)
		}
		l, err := s.layoutC(ctx, tx, sess.model)
		if err != nil {
			return err
		}
		fresh := in.Saved
		if !in.Partial {
			fresh = nil
			if fr.TokenLength > 0 {
				fresh = splitFresh(l, fr, split)
			}
		} else if err := checkSaved(l, fr, split, fresh); err != nil {
			return errs.New(errs.ErrBadRequest, "commit of plan %d: %v; nothing recorded", planID, err)
		}
		if in.Held != nil && len(fresh) > 0 {
			if err := in.Held(l, fresh); err != nil {
				return fmt.Errorf("commit of plan %d: %w", planID, err)
			}
		}
		for _, r := range fresh {
			if !recordsWritten(in) {
				f, err := s.fileBy(ctx, tx, "path", r.Path)
				if err != nil {
					return err
				}
				if f.Size < r.KVStart+r.KVLength {
					return errs.New(errs.ErrBadRequest, "fresh range of plan %d not written: %s holds %d bytes, the range ends at %d; write it and Sync before commit",
						planID, r.Path, f.Size, r.KVStart+r.KVLength)
				}
				continue
			}
			// Recorded even when the file's size covers the range (commitMem
			// says why): it only raises lengths and size.
			if err := s.recordWrittenTx(ctx, tx, r, in.Now.UnixNano()); err != nil {
				return fmt.Errorf("commit of plan %d: %w", planID, err)
			}
		}
		if pc.hashes, err = decodeHashes(planHashes); err != nil {
			return err
		}
		ch, err := computeCommit(l, e, fr.TokenStart, fresh, pc)
		if err != nil {
			return err
		}
		exec := func(q string, args ...any) error {
			_, err := tx.ExecContext(ctx, s.q(q), args...)
			return wrapDB(err)
		}
		next, err := s.replaceRanges(exec, id, e, planID, fr.TokenStart, ch, in.Now)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM kv_plans WHERE id = ?`), planID); err != nil {
			return wrapDB(err)
		}
		s.cache.removePlan(planID)
		s.cache.putSession(id, next)
		return s.afterSlowCommit(ctx, tx, id, fresh) // writebehind.go
	})
	if err != nil {
		return Session{}, err
	}
	return s.Session(ctx, id)
}

// holds reports whether ranges include every one of want, exactly.
func holds(ranges, want []Range) bool {
	for _, w := range want {
		if !slices.Contains(ranges, w) {
			return false
		}
	}
	return true
}

// planContent is what a plan row knew of its prompt (content.go).
type planContent struct {
	from, planned int64
	hashes        []BlockHash
}

// commitChange is what a commit makes of a session: its ranges, tokens and
// hashes after it (computeCommit).
type commitChange struct {
	next   []Range
	tokens int64
	hashes []BlockHash
	hashed int64
}

// computeCommit cuts session e at token keep and appends fresh
// (afterCommit), and computes the hashes of what it then holds
// (hashesAfterCommit); it writes nothing.
func computeCommit(l Layout, e *cachedSession, keep int64, fresh []Range, pc planContent) (commitChange, error) {
	next, err := afterCommit(l, e.ranges, keep, fresh)
	if err != nil {
		return commitChange{}, err
	}
	var tokens int64
	if n := len(next); n > 0 {
		tokens = next[n-1].TokenStart + next[n-1].TokenLength
	}
	pt := int64(l.PageTokens)
	hashes, hashed := hashesAfterCommit(pt, e.row.hashes, e.row.hashed, keep, tokens, pc.from, pc.hashes, pc.planned)
	if err := checkHashes(pt, hashes, hashed, tokens); err != nil {
		return commitChange{}, err
	}
	return commitChange{next: next, tokens: tokens, hashes: hashes, hashed: hashed}, nil
}

// execFn runs one statement (placeholders as ?): in the operation's
// transaction, or into the write-behind log (writebehind.go).
type execFn func(q string, args ...any) error

// replaceRanges writes change ch of session id (entry e, equal to SQL),
// cut at token keep: only the range rows that change, the session's tokens
// and hashes, its version counted up and plan recorded as its last commit.
// It returns the session's new entry.
func (s *sqlStore) replaceRanges(exec execFn, id string, e *cachedSession, plan, keep int64, ch commitChange, now time.Time) (*cachedSession, error) {
	ranges := e.ranges
	// A turn that only appends (keep at the session's end) has no range
	// row to delete: the statement would only cost the flush a seek.
	if n := len(ranges); n > 0 && ranges[n-1].TokenStart >= keep {
		if err := exec(`DELETE FROM kv_ranges WHERE session_id = ? AND token_start >= ?`, id, keep); err != nil {
			return nil, err
		}
	}
	for i, r := range ch.next {
		var err error
		switch {
		case r.TokenStart >= keep:
			err = exec(`INSERT INTO kv_ranges (session_id, token_start, token_length, path, kv_start, kv_length)
				VALUES (?, ?, ?, ?, ?, ?)`, id, r.TokenStart, r.TokenLength, r.Path, r.KVStart, r.KVLength)
		case r != ranges[i]: // the range cut at keep
			err = exec(`UPDATE kv_ranges SET token_length = ?, kv_length = ? WHERE session_id = ? AND token_start = ?`,
				r.TokenLength, r.KVLength, id, r.TokenStart)
		}
		if err != nil {
			return nil, err
		}
	}
	// e.lastUsed counts the session's outstanding plans (lastUsedCol), so
	// this last_used stays their latest too once the plan's row goes.
	used := max(now.UnixNano(), e.lastUsed)
	if err := exec(`UPDATE kv_sessions SET tokens = ?, version = ?, last_used = ?, hashes = ?, hashed_tokens = ?, last_plan = ? WHERE id = ?`,
		ch.tokens, e.row.version+1, used, encodeHashes(ch.hashes), ch.hashed, plan, id); err != nil {
		return nil, err
	}
	n := *e
	n.row.tokens, n.row.version, n.row.hashes, n.row.hashed = ch.tokens, e.row.version+1, ch.hashes, ch.hashed
	n.ranges, n.lastPlan, n.lastUsed = ch.next, plan, used
	return &n, nil
}

// ForkSession makes dst share src's ranges (no bytes are copied).
// A fork with a request id that finds dst made by a fork of the same id
// (the first attempt applied, its answer lost) is answered as done.
func (s *sqlStore) ForkSession(ctx context.Context, src, dst, requestID string, now time.Time) error {
	if err := checkSessionID(dst); err != nil {
		return err
	}
	if err := checkText("session id", src); err != nil {
		return err
	}
	caller := ctx
	ctx = context.WithoutCancel(ctx)
	return s.groupTx(caller, func(tx *sql.Tx) error {
		e, ok, err := s.sessionC(ctx, tx, src) // cache.go
		if err != nil {
			return err
		}
		if !ok {
			return errs.New(errs.ErrNotFound, "no session %s", src)
		}
		sess := e.row
		if d, exists, err := s.sessionC(ctx, tx, dst); err != nil {
			return err
		} else if exists {
			if requestID != "" && d.forkReq == requestID {
				return nil // a repeat of the fork that made it
			}
			return errs.New(errs.ErrExists, "session %s already exists", dst)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO kv_sessions (id, model, tokens, last_used, created, file_seq, hashes, hashed_tokens, fork_request) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?)`),
			dst, sess.model, sess.tokens, now.UnixNano(), now.UnixNano(), encodeHashes(sess.hashes), sess.hashed, requestID); err != nil {
			return wrapDB(err)
		}
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO kv_ranges (session_id, token_start, token_length, path, kv_start, kv_length)
			SELECT ?, token_start, token_length, path, kv_start, kv_length FROM kv_ranges WHERE session_id = ?`), dst, src)
		// dst is in SQL, not in memory: a plan that read SQL before this
		// must not make it in memory (writebehind.go, planFast).
		s.cache.absentGen++
		return wrapDB(err)
	})
}

func (s *sqlStore) DeleteSession(ctx context.Context, id string) error {
	if err := checkText("session id", id); err != nil {
		return err
	}
	caller := ctx
	ctx = context.WithoutCancel(ctx)
	return s.groupTx(caller, func(tx *sql.Tx) error {
		return s.deleteSessionTx(ctx, tx, id)
	})
}

func (s *sqlStore) Session(ctx context.Context, id string) (Session, error) {
	if err := checkText("session id", id); err != nil {
		return Session{}, err
	}
	if err := s.barrier(ctx); err != nil { // writebehind.go
		return Session{}, err
	}
	out := Session{ID: id}
	var lu, pu, cr int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT model, tokens, last_used, `+lastUsedCol+`, created, hashed_tokens,
		(SELECT COALESCE(SUM(reserved), 0) FROM kv_files WHERE session_id = kv_sessions.id) FROM kv_sessions WHERE id = ?`), id).
		Scan(&out.Model, &out.Tokens, &lu, &pu, &cr, &out.HashedTokens, &out.Bytes)
	lu = max(lu, pu)
	if errors.Is(err, sql.ErrNoRows) {
		return out, errs.New(errs.ErrNotFound, "no session %s", id)
	}
	if err != nil {
		return out, wrapDB(err)
	}
	out.LastUsed, out.Created = time.Unix(0, lu).UTC(), time.Unix(0, cr).UTC()
	out.Ranges, err = s.rangesTx(ctx, s.db, id)
	return out, err
}

func (s *sqlStore) Sessions(ctx context.Context, after string, limit int) ([]Session, error) {
	if err := checkText("?after", after); err != nil {
		return nil, err
	}
	if err := s.barrier(ctx); err != nil { // writebehind.go
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, model, tokens, last_used, `+lastUsedCol+`, created, hashed_tokens,
		(SELECT COALESCE(SUM(reserved), 0) FROM kv_files WHERE session_id = kv_sessions.id)
		FROM kv_sessions WHERE id > ? ORDER BY id LIMIT ?`), after, limit)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		var x Session
		var lu, pu, cr int64
		if err := rows.Scan(&x.ID, &x.Model, &x.Tokens, &lu, &pu, &cr, &x.HashedTokens, &x.Bytes); err != nil {
			return nil, wrapDB(err)
		}
		lu = max(lu, pu)
		x.LastUsed, x.Created = time.Unix(0, lu).UTC(), time.Unix(0, cr).UTC()
		out = append(out, x)
	}
	return out, wrapDB(rows.Err())
}

// SessionFiler is implemented by stores that tell a session's file (one
// a plan made, in kv_files) from any other.
type SessionFiler interface {
	// SessionFile says whether path is a session's file: one whose size a
	// session commit records once the servers vouch for its bytes
	// (recordsWritten), so its writer may leave out the Sync.
	SessionFile(ctx context.Context, path string) (bool, error)
}

func (s *sqlStore) SessionFile(ctx context.Context, path string) (bool, error) {
	// Memory holds a file with its kv_files row (loadFile): a registered
	// prefix a plan read has none.
	s.wb.mu.Lock()
	c, ok := s.cache.files[path]
	owned := ok && c.owner != ""
	s.wb.mu.Unlock()
	if ok {
		return owned, nil
	}
	var one int
	err := s.db.QueryRowContext(ctx, s.q(`SELECT 1 FROM kv_files WHERE path = ?`), path).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, wrapDB(err)
}

// inUseTx names the session that references path through a range or owns
// it as a session file, or "" when none does.
func (s *sqlStore) inUseTx(ctx context.Context, x execer, path string) (string, error) {
	var id string
	err := x.QueryRowContext(ctx, s.q(`SELECT session_id FROM kv_ranges WHERE path = ? UNION SELECT session_id FROM kv_files WHERE path = ? LIMIT 1`), path, path).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", wrapDB(fmt.Errorf("in use check: %w", err))
	}
	return id, nil
}

// planAnswer is p as json.Marshal writes it, kept for a repeat of its
// request id: encoded into a pooled buffer and copied once into the string
// (json.Marshal copies its result out of its own buffer first).
func planAnswer(p *Plan) (string, error) {
	b := answerBufs.Get()
	defer answerBufs.Put(b)
	if err := json.NewEncoder(b).Encode(p); err != nil {
		return "", err
	}
	return string(bytes.TrimSuffix(b.Bytes(), []byte("\n"))), nil // Encode ends the value with one newline
}

var answerBufs = bufpool.NewBuffers(64 << 10)
