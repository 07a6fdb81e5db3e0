package meta

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"

	"github.com/gd2fs/gd2fs/errs"
)

// Seeding many sessions for a benchmark of the session table's scale
// (gd2fs-bench plan --seed; docs/kv-cache.md, "Scale of the session
// table"). Made through plans and commits, a million sessions of a few
// turns take hours here; SeedSessions instead copies one template session,
// made through plans and commits, row for row: the copies are what the same
// plans and commits would have written for sessions of other ids (ids from
// the id counter moved past every id in use, in the same order, so they
// are unique; times one nanosecond apart, so the LRU order is the copies'
// order). TestSeedSessions compares a copy with a twin made through the API
// and runs the invariants over both. It is a bulk path for benchmarks: the
// sessions lock is held only per batch, and a leader's session cache is
// dropped (sessions_gen).

// SeedInput says what SeedSessions copies and into which ids.
type SeedInput struct {
	// Template is a session made through plans and commits with no plan
	// outstanding, not a fork (its ranges lie in its own files and in
	// registered prefixes), whose files lie in Dir/Template/.
	Template string
	Dir      string
	// N copies, the i-th named ID(i); Batch copies per transaction
	// (default 10,000). Progress, when set, is called after each batch.
	N        int
	ID       func(i int) string
	Batch    int
	Progress func(done int)
}

// seedTable is a table's rows of the template and how a copy changes them.
type seedTable struct {
	name string
	cols []string
	rows [][]any
}

// SeedSessions copies in.Template in.N times (see above). st must be a
// store Open returned.
func SeedSessions(ctx context.Context, st Store, in SeedInput) error {
	s, ok := st.(*sqlStore)
	if !ok {
		return errs.New(errs.ErrBadRequest, "seed: not a store meta.Open returned")
	}
	if err := checkSessionID(in.Template); err != nil {
		return err
	}
	if in.N < 0 || in.ID == nil {
		return errs.New(errs.ErrBadRequest, "seed: give N >= 0 and ID")
	}
	if in.Batch <= 0 {
		in.Batch = 10000
	}
	for _, i := range []int{0, in.N - 1} {
		if in.N > 0 {
			if err := checkSessionID(in.ID(i)); err != nil {
				return err
			}
		}
	}
	// The template's last commit may be answered from memory and not yet
	// in SQL (window mode), where the copies are read from.
	if err := s.barrier(ctx); err != nil {
		return err
	}
	var tables []seedTable
	var stride, reserved int64
	err := s.lockedTx(ctx, func(tx *sql.Tx) error {
		var err error
		if tables, err = s.seedTemplate(ctx, tx, in); err != nil {
			return err
		}
		// Ids: every id the template holds is at most the counter's value
		// cur; copy i adds (i+1)*stride to each, which keeps them apart
		// from each other and from every id issued so far.
		for _, t := range tables {
			if t.name == "kv_files" {
				for _, r := range t.rows {
					reserved += r[col(t.cols, "reserved")].(int64)
				}
			}
		}
		lo, err := seedLowestID(tables, in)
		if err != nil {
			return err
		}
		cur, err := s.counter(ctx, tx, "next_id", 0)
		if err != nil {
			return err
		}
		stride = cur - lo + 1
		if _, err := s.counter(ctx, tx, "next_id", int64(in.N)*stride); err != nil {
			return err
		}
		return s.seedGen(ctx, tx)
	})
	if err != nil {
		return err
	}
	for done := 0; done < in.N; {
		n := min(in.Batch, in.N-done)
		err := s.lockedTx(ctx, func(tx *sql.Tx) error {
			for _, t := range tables {
				if err := s.seedInsert(ctx, tx, t, in, stride, done, n); err != nil {
					return err
				}
			}
			if _, err := s.counter(ctx, tx, "kv_reserved", int64(n)*reserved); err != nil {
				return err
			}
			return s.seedGen(ctx, tx)
		})
		if err != nil {
			return err
		}
		done += n
		if in.Progress != nil {
			in.Progress(done)
		}
	}
	return nil
}

// seedGen tells a leader's session cache that sessions were written
// without it (cache.go).
func (s *sqlStore) seedGen(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `UPDATE counters SET v = v + 1 WHERE k = 'sessions_gen'`)
	return wrapDB(err)
}

// seedTemplate reads the template's rows of every table a session's plans
// and commits write.
func (s *sqlStore) seedTemplate(ctx context.Context, tx *sql.Tx, in SeedInput) ([]seedTable, error) {
	var plans int
	if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM kv_plans WHERE session_id = ?`), in.Template).Scan(&plans); err != nil {
		return nil, wrapDB(err)
	}
	if plans > 0 {
		return nil, errs.New(errs.ErrBadRequest, "seed: template %s has %d plans outstanding: commit them first", in.Template, plans)
	}
	dir := in.Dir + "/" + in.Template
	q := []struct{ name, where string }{
		{"kv_sessions", `id = ?`},
		{"kv_ranges", `session_id = ?`},
		{"kv_files", `session_id = ?`},
		{"dirs", `path = ?`},
		{"files", `parent = ?`},
		{"file_attrs", `path IN (SELECT path FROM files WHERE parent = ?)`},
		{"chunks", `file_id IN (SELECT id FROM files WHERE parent = ?)`},
		{"replicas", `chunk_id IN (SELECT c.id FROM chunks c JOIN files f ON f.id = c.file_id WHERE f.parent = ?)`},
	}
	var out []seedTable
	for _, t := range q {
		arg := in.Template
		if t.name == "dirs" || t.name == "files" || t.name == "file_attrs" || t.name == "chunks" || t.name == "replicas" {
			arg = dir
		}
		rows, err := tx.QueryContext(ctx, s.q(`SELECT * FROM `+t.name+` WHERE `+t.where), arg)
		if err != nil {
			return nil, wrapDB(err)
		}
		st := seedTable{name: t.name}
		if st.cols, err = rows.Columns(); err != nil {
			rows.Close()
			return nil, wrapDB(err)
		}
		for rows.Next() {
			v := make([]any, len(st.cols))
			p := make([]any, len(v))
			for i := range v {
				p[i] = &v[i]
			}
			if err := rows.Scan(p...); err != nil {
				rows.Close()
				return nil, wrapDB(err)
			}
			for i, x := range v {
				if b, ok := x.([]byte); ok { // SQLite's TEXT may scan as bytes
					v[i] = string(b)
				}
			}
			st.rows = append(st.rows, v)
		}
		if err := rows.Close(); err != nil {
			return nil, wrapDB(err)
		}
		out = append(out, st)
	}
	if len(out[0].rows) != 1 {
		return nil, errs.New(errs.ErrNotFound, "seed: no session %s", in.Template)
	}
	// A range must lie in the template's own file or a registered prefix.
	for _, r := range out[1].rows {
		p := r[col(out[1].cols, "path")].(string)
		if strings.HasPrefix(p, dir+"/") {
			continue
		}
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM kv_prefixes WHERE path = ?`), p).Scan(&n); err != nil {
			return nil, wrapDB(err)
		}
		if n == 0 {
			return nil, errs.New(errs.ErrBadRequest, "seed: template %s has a range in %s, neither its own file nor a prefix (a fork?): use a session made by plans and commits", in.Template, p)
		}
	}
	return out, nil
}

func col(cols []string, name string) int {
	for i, c := range cols {
		if strings.EqualFold(c, name) {
			return i
		}
	}
	return -1
}

// seedIDCols are the columns that hold ids from the id counter (0: none).
var seedIDCols = map[string][]string{
	"kv_sessions": {"file_seq", "last_plan"},
	"files":       {"id"},
	"chunks":      {"id", "file_id"},
	"replicas":    {"chunk_id"},
}

// seedLowestID is the lowest id from the counter the template holds,
// including the numbers of its files' names.
func seedLowestID(tables []seedTable, in SeedInput) (int64, error) {
	lo := int64(-1)
	see := func(v int64) {
		if v > 0 && (lo < 0 || v < lo) {
			lo = v
		}
	}
	for _, t := range tables {
		for _, c := range seedIDCols[t.name] {
			i := col(t.cols, c)
			for _, r := range t.rows {
				v, ok := r[i].(int64)
				if !ok {
					return 0, errs.New(errs.ErrInternal, "seed: %s.%s is %T", t.name, c, r[i])
				}
				see(v)
			}
		}
		if i := col(t.cols, "path"); i >= 0 {
			for _, r := range t.rows {
				if seq, ok := seedFileSeq(r[i].(string), in.Dir+"/"+in.Template+"/"); ok {
					see(seq)
				}
			}
		}
	}
	if lo < 0 {
		return 1, nil
	}
	return lo, nil
}

// seedFileSeq is the number of session file p in dir (dir/kv-<seq>).
func seedFileSeq(p, dir string) (int64, bool) {
	rest, ok := strings.CutPrefix(p, dir+"kv-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	return n, err == nil
}

// seedInsert inserts copies [first, first+n) of t's rows.
func (s *sqlStore) seedInsert(ctx context.Context, tx *sql.Tx, t seedTable, in SeedInput, stride int64, first, n int) error {
	if len(t.rows) == 0 {
		return nil
	}
	tdir := in.Dir + "/" + in.Template
	idCols := map[int]bool{}
	for _, c := range seedIDCols[t.name] {
		idCols[col(t.cols, c)] = true
	}
	// Up to 30,000 values a statement (SQLite's default limit is 32,766).
	per := max(1, 30000/len(t.cols))
	var args []any
	rowsIn := 0
	flush := func() error {
		if rowsIn == 0 {
			return nil
		}
		one := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(t.cols)), ", ") + ")"
		q := `INSERT INTO ` + t.name + ` (` + strings.Join(t.cols, ", ") + `) VALUES ` + strings.TrimSuffix(strings.Repeat(one+", ", rowsIn), ", ")
		if _, err := tx.ExecContext(ctx, s.q(q), args...); err != nil {
			return wrapDB(fmt.Errorf("seed %s: %w", t.name, err))
		}
		args, rowsIn = args[:0], 0
		return nil
	}
	for i := first; i < first+n; i++ {
		id := in.ID(i)
		off := int64(i+1) * stride
		dir := in.Dir + "/" + id
		for _, r := range t.rows {
			for j, v := range r {
				c := strings.ToLower(t.cols[j])
				switch x := v.(type) {
				case int64:
					switch {
					case idCols[j] && x > 0:
						v = x + off
					case c == "last_used" || c == "created" || c == "mtime":
						v = x + int64(i) + 1
					}
				case string:
					switch {
					case x == in.Template && (c == "id" || c == "session_id"):
						v = id
					case x == tdir:
						v = dir
					case strings.HasPrefix(x, tdir+"/"):
						if seq, ok := seedFileSeq(x, tdir+"/"); ok {
							v = dir + "/kv-" + strconv.FormatInt(seq+off, 10)
						} else {
							v = dir + strings.TrimPrefix(x, tdir)
						}
					}
				}
				args = append(args, v)
			}
			if rowsIn++; rowsIn == per {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	return flush()
}

// WarmSessions loads sessions ids into the leader's session cache, as the
// plans of a leader that has served them all would have (gd2fs-bench plan
// measures what that memory costs). st must lead; ids that name no session
// are skipped.
func WarmSessions(ctx context.Context, st Store, ids []string) error {
	s, ok := st.(*sqlStore)
	if !ok {
		return errs.New(errs.ErrBadRequest, "warm: not a store meta.Open returned")
	}
	return s.groupTx(ctx, func(tx *sql.Tx) error {
		if !s.cache.on {
			return errs.New(errs.ErrUnavailable, "warm: this store does not lead")
		}
		for _, id := range ids {
			if _, _, err := s.sessionC(ctx, tx, id); err != nil {
				return err
			}
		}
		return nil
	})
}

// ReservedBytes is what session files reserve in all (the quota's total,
// counters.kv_reserved), for gd2fs-bench plan's quota measurement.
func ReservedBytes(ctx context.Context, st Store) (int64, error) {
	s, ok := st.(*sqlStore)
	if !ok {
		return 0, errs.New(errs.ErrBadRequest, "reserved: not a store meta.Open returned")
	}
	var v int64
	err := s.db.QueryRowContext(ctx, quotaTotalQuery).Scan(&v)
	return v, wrapDB(err)
}
