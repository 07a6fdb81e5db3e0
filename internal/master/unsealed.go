package master

import (
	"context"
	"errors"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/meta"
)

// A writer that dies before it seals its file (kill -9 of a `gd2fs cp`, of
// a process writing through `gd2fs mount`, or of the mount daemon itself)
// leaves the file unsealed: its committed bytes readable, its size
// partial, nothing to say it will never grow. The master cannot ask the
// writer, so it goes by time: a create, an allocation of new chunks and a
// commit move the file's modification time, and an unsealed file left
// alone for Config.UnsealedTTL is removed (meta.ExpireUnsealed; chunks
// freed at the servers' next heartbeats). Until then it shows as unsealed
// (`gd2fs ls -l`, `gd2fs stat`, mode 0644 through the mount) and `gd2fs
// rm` removes it.

// DefaultUnsealedTTL is Config.UnsealedTTL's default: long enough for any
// writer that allocates or commits now and then, short enough that a dead
// writer's partial file does not outlive the day.
const DefaultUnsealedTTL = 24 * time.Hour

// expireEvery is how often the leader looks for abandoned files.
const expireEvery = time.Minute

// touchAfter: an allocation moves a file's time only when it is older than
// this, so a writer costs one more commit a minute at most.
const touchAfter = time.Minute

// ExpireUnsealed removes the unsealed files nothing wrote to in the
// Config.UnsealedTTL before now, and returns how many. The leader's loop
// calls it every minute; tests call it with a now of their choosing.
func (m *Master) ExpireUnsealed(ctx context.Context, now time.Time) (int, error) {
	if m.cfg.UnsealedTTL <= 0 {
		return 0, nil
	}
	total := 0
	for {
		gone, err := m.meta.ExpireUnsealed(ctx, now.Add(-m.cfg.UnsealedTTL), 100)
		for _, f := range gone {
			m.log.Warn("removed an abandoned file: unsealed and not written for longer than --unsealed-ttl (its writer died)",
				"file", f.Path, "bytes", f.Size, "last_written", f.Modified, "ttl", m.cfg.UnsealedTTL)
		}
		total += len(gone)
		if err != nil || len(gone) < 100 {
			return total, err
		}
	}
}

// touch moves an unsealed file's time to now, if it is older than
// touchAfter: its writer is alive (it allocates chunks).
func (m *Master) touch(ctx context.Context, f meta.File) error {
	now := time.Now().UTC()
	if f.Sealed || now.Sub(f.Modified) < touchAfter {
		return nil
	}
	_, err := m.meta.Commit(ctx, f.ID, 0, nil, false, now) // sizes only grow: nothing else changes
	if errors.Is(err, errs.ErrSealed) {
		return nil // sealed meanwhile by its writer
	}
	return err
}
