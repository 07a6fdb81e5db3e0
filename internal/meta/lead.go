package meta

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Leadership among masters sharing one store. With PostgreSQL several
// masters run and one holds a session-level advisory lock on a dedicated
// connection: if its process dies, the connection closes, PostgreSQL
// releases the lock, and a standby takes it. With SQLite only one master may
// use a database file: an exclusive flock on <file>.lock makes a second one
// a standby instead of a second writer.

// Advisory lock keys are (hash of the schema, key), so clusters (and
// tests) in different schemas of one database never contend.
const (
	leaderLockKey   = 7070002
	sessionsLockKey = 7070003
)

// leadTimeout bounds one leadership check (the ping of the lock's session,
// or the attempt to take it).
const leadTimeout = 3 * time.Second

// leaderSessionSettings are set on the session that holds the leader lock.
var leaderSessionSettings = []string{
	`SET tcp_keepalives_idle = 2`,
	`SET tcp_keepalives_interval = 1`,
	`SET tcp_keepalives_count = 3`,
	`SET tcp_user_timeout = 5000`,
}

type leadership struct {
	mu     sync.Mutex
	conn   *sql.Conn // PostgreSQL: holds the advisory lock
	lock   *os.File  // SQLite: holds the flock
	file   string    // SQLite database file
	leader bool
}

// Lead makes this store the leader if no other holds leadership, records
// url as the leader's address, and reports whether this store leads now.
// Called periodically: it also notices a lost lock (a dropped connection).
func (s *sqlStore) Lead(ctx context.Context, url string) (bool, error) {
	// A master cut off from the database must notice within a bound, step
	// down and stop answering as the leader; without a deadline its ping
	// waits for TCP to give up (minutes).
	ctx, cancel := context.WithTimeout(ctx, leadTimeout)
	defer cancel()
	l := &s.lead
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leader {
		if s.postgres {
			if err := l.conn.PingContext(ctx); err != nil {
				l.conn.Close()
				l.conn, l.leader = nil, false
				s.leadTerm.Store(0)
				return false, nil
			}
		}
		return true, nil
	}
	if s.postgres {
		c, err := s.db.Conn(ctx)
		if err != nil {
			return false, wrapDB(err)
		}
		// The database must notice a leader it cannot reach, too: until
		// PostgreSQL ends the lock's session, no standby can lead. Its
		// defaults wait for the kernel's keepalive (2 hours); these end the
		// session about 5 s after the leader falls silent, whether the
		// session was idle (keepalives) or had unacknowledged data (user
		// timeout). Each SET is per session and any role may make it.
		for _, q := range leaderSessionSettings {
			if _, err := c.ExecContext(ctx, q); err != nil {
				c.Close()
				return false, wrapDB(err)
			}
		}
		var got bool
		if err := c.QueryRowContext(ctx, `SELECT pg_try_advisory_lock(hashtext(current_schema()), $1)`, leaderLockKey).Scan(&got); err != nil {
			c.Close()
			return false, wrapDB(err)
		}
		if !got {
			c.Close()
			return false, nil
		}
		l.conn = c
	} else {
		f, err := os.OpenFile(l.file+".lock", os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return false, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return false, nil
			}
			return false, err
		}
		l.lock = f
	}
	// A standby opened before a newer master led (and raised the format)
	// must not lead now; with the lock held, no newer master writes
	// meanwhile.
	if err := s.checkFormat(ctx); err != nil {
		l.releaseLocked()
		return false, err
	}
	if err := s.raiseFormat(ctx); err != nil {
		l.releaseLocked()
		return false, err
	}
	l.leader = true
	// A new lead term: the session cache of any master that led before
	// (this one too) is not used again (cache.go).
	term, err := s.counter(ctx, s.db, "lead_term", 1)
	if err != nil {
		l.releaseLocked()
		return false, err
	}
	s.leadTerm.Store(term)
	_, err = s.db.ExecContext(ctx, s.q(`INSERT INTO cluster_info (k, v) VALUES ('leader', ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`), url)
	return true, wrapDB(err)
}

// Leader is the address the current leader recorded ("" if none yet).
func (s *sqlStore) Leader(ctx context.Context) (string, error) {
	var v string
	err := s.db.QueryRowContext(ctx, `SELECT v FROM cluster_info WHERE k = 'leader'`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, wrapDB(err)
}

func (l *leadership) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked()
}

func (l *leadership) releaseLocked() {
	if l.conn != nil {
		// Unlock before the connection goes back to the pool: a pooled
		// session would keep the lock until the pool closes it.
		l.conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock(hashtext(current_schema()), $1)`, leaderLockKey)
		l.conn.Close()
	}
	if l.lock != nil {
		l.lock.Close() // closing the descriptor drops the flock
	}
	l.conn, l.lock, l.leader = nil, nil, false
}
