package client

import (
	"context"
	"net/url"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
)

// DrainServer marks server id as leaving (undo: takes that back). It leaves
// the membership map at once, so its KV blocks get new owners, which copy
// them from it in the background (and on first read) while it keeps serving
// them; it is safe to stop once DrainDone reports true. The mark lives in
// the master's memory: a master restart forgets it (drain again).
func (c *Client) DrainServer(ctx context.Context, id string, undo bool) (api.ServerInfo, error) {
	route := "/v1/servers/" + url.PathEscape(id) + "/drain"
	if undo {
		route += "?undo=1"
	}
	var info api.ServerInfo
	err := c.api.Do(ctx, "POST", route, nil, &info)
	return info, err
}

// DrainDone reports whether draining server id holds no KV blocks any more
// (as its last heartbeat said), and how many it holds. A heartbeat sent
// before the drain, or before blocks were put, can say 0: WaitDrained
// waits for a heartbeat newer than its first look.
func (c *Client) DrainDone(ctx context.Context, id string) (done bool, blocks int64, err error) {
	done, blocks, _, err = c.drainState(ctx, id)
	return done, blocks, err
}

// drainState is DrainDone with the time of the heartbeat it reports.
func (c *Client) drainState(ctx context.Context, id string) (done bool, blocks int64, seen time.Time, err error) {
	st, err := c.Status(ctx)
	if err != nil {
		return false, 0, time.Time{}, err
	}
	for _, s := range st.Servers {
		if s.ID != id {
			continue
		}
		if s.KV == nil {
			return true, 0, s.LastSeen, nil
		}
		return s.KV.Keys == 0, s.KV.Keys, s.LastSeen, nil
	}
	return false, 0, time.Time{}, errs.New(errs.ErrNotFound, "no server %q: gd2fs status lists the servers", id)
}

// WaitDrained polls DrainDone until it is true or ctx ends; progress, when
// not nil, hears the block count after each poll. Done counts only from a
// heartbeat the master received after WaitDrained's first look: the one
// before may predate the drain, or blocks put just before it, and say 0
// (a drain then "finished" at once with every block still on the server).
func (c *Client) WaitDrained(ctx context.Context, id string, every time.Duration, progress func(blocks int64)) error {
	var first time.Time
	for i := 0; ; i++ {
		done, n, seen, err := c.drainState(ctx, id)
		if err != nil {
			return err
		}
		if i == 0 {
			first = seen
		}
		if progress != nil {
			progress(n)
		}
		if done && seen.After(first) {
			return nil
		}
		select {
		case <-ctx.Done():
			return errs.New(errs.ErrUnavailable, "server %s still holds %d KV blocks: its blocks are still moving (gd2fs status shows progress); wait longer or stop it anyway (its one-copy blocks are then misses): %w", id, n, ctx.Err())
		case <-time.After(every):
		}
	}
}
