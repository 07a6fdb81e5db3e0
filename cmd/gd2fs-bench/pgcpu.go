package main

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// A master on PostgreSQL hands part of each turn's work to the database's
// own processes, which the master's CPU time does not include. When the
// server runs on this machine, pgMeter counts them too (the postmaster and
// every process it started: backends, WAL writer, checkpointer), so the
// CPU a turn costs is compared whole with SQLite's, which runs inside the
// master.

// postmasterOf returns the pid of the PostgreSQL postmaster dsn reaches,
// if it runs on this machine (0 and no error when it does not).
func postmasterOf(ctx context.Context, dsn string) (int, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var backend int
	if err := db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, err
	}
	pp, err := procParent(backend)
	if err != nil {
		return 0, nil // another machine's pid (or another pid namespace)
	}
	return pp, nil
}

// procParent is field 4 of /proc/<pid>/stat.
func procParent(pid int) (int, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}

// pgMeter measures the CPU time of a postmaster and its children between
// Start and total: a backend started in between counts from zero, and one
// that ended in between counts whole in the postmaster's reaped children's
// time, where its time before Start, counted at Start, moved too. (A
// meter of live processes alone read 0.03 s a 1,000 turns at 100,000
// sessions: the backends that did the work had ended.)
type pgMeter struct {
	postmaster int
	start      map[int]time.Duration
}

// reaped keys the postmaster's reaped children's time in a sample.
const reaped = -1

// sample reads the postmaster's time, its reaped children's and each live
// child's. A child reaped between the reaped time's reading and the scan of
// /proc would be in neither, so the scan is taken again until the reaped
// time read before and after it agree (a child that ended but is not yet
// reaped is still in /proc with its times).
func (m *pgMeter) sample() map[int]time.Duration {
	var out map[int]time.Duration
	for try := 0; try < 5; try++ {
		before, err := procReapedCPU(m.postmaster)
		out = m.scan()
		if err != nil {
			return out
		}
		out[reaped] = before
		if after, err := procReapedCPU(m.postmaster); err != nil || after == before {
			return out
		}
	}
	return out
}

// scan is the postmaster's own time and each live child's, by pid.
func (m *pgMeter) scan() map[int]time.Duration {
	out := map[int]time.Duration{}
	if d, err := procCPU(m.postmaster); err == nil {
		out[m.postmaster] = d
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := procParent(pid); err == nil && pp == m.postmaster {
			if d, err := procCPU(pid); err == nil {
				out[pid] = d
			}
		}
	}
	return out
}

func (m *pgMeter) Start() { m.start = m.sample() }

// total is the CPU time since Start: every sample's sum less Start's, so a
// backend that ended leaves its time before Start out (it is in the reaped
// children's time now, whole).
func (m *pgMeter) total() time.Duration {
	var sum time.Duration
	for _, d := range m.sample() {
		sum += d
	}
	for _, d := range m.start {
		sum -= d
	}
	return sum
}

// pgWAL returns a PostgreSQL server's WAL insert position
// (pg_current_wal_insert_lsn) and, given the position of an earlier call,
// the WAL bytes written since: the whole server's, other databases'
// included. A master's own writes on PostgreSQL are its socket's, so the
// WAL is what compares with the pages SQLite writes inside the master
// (docs/benchmarks.md, "Twenty-second session"). The insert position moves as records are inserted (the
// write position may lag it, with synchronous_commit off), unlike
// pg_stat_wal's counters, which a backend reports when it goes idle.
func pgWAL(ctx context.Context, dsn, since string) (lsn string, written int64, err error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "", 0, err
	}
	defer db.Close()
	if since == "" {
		err = db.QueryRowContext(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn)
		return lsn, 0, err
	}
	err = db.QueryRowContext(ctx, `SELECT pg_current_wal_insert_lsn()::text, pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint`, since).Scan(&lsn, &written)
	return lsn, written, err
}
