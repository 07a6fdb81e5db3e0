package resp

import (
	"context"
	"errors"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/kvstore"
)

// Backend is the key space the RESP server serves. Misses are
// errs.ErrNotFound; an owner that cannot be reached is errs.ErrUnavailable.
type Backend interface {
	// Get calls fn with the value's bytes, valid only during fn.
	Get(ctx context.Context, key []byte, fn func(bufs [][]byte, size int) error) error
	// Put stores value; with overwrite false an existing key is kept and
	// existed reports it.
	Put(ctx context.Context, key, value []byte, overwrite bool) (existed bool, err error)
	// Stat returns the value's size.
	Stat(ctx context.Context, key []byte) (int64, error)
	// Delete removes key and reports whether it was there.
	Delete(ctx context.Context, key []byte) (bool, error)
	// Scan lists keys from cursor on (0 to start; 0 back when complete).
	Scan(ctx context.Context, cursor uint64, count int) ([]string, uint64, error)
	// Count is the number of keys.
	Count(ctx context.Context) (int64, error)
	// Retain changes key's pin, priority or TTL; gone: it expired at once.
	Retain(ctx context.Context, key []byte, o client.RetainOptions) (r client.Retention, gone bool, err error)
	// Retention returns key's pin, priority and TTL left.
	Retention(ctx context.Context, key []byte) (client.Retention, error)
	// Prefetch copies key's block to its owner's DRAM if it is on disk
	// there (EXISTS with the door's prefetch on: prefetch.go).
	Prefetch(ctx context.Context, key []byte) error
}

// reserver is a Backend that can take a large SET's value straight into a
// local store's DRAM pages (Cluster with a Local): the reader asks Reserve
// for pages before the value's bytes arrive, reads them there from the
// socket, and set stores them with PutReserved. One copy, the kernel's.
type reserver interface {
	// Reserve returns pages for a value of size bytes under key, or nil
	// where the value should be read and Put the ordinary way.
	Reserve(ctx context.Context, key []byte, size int64, overwrite bool) (*kvstore.Reservation, error)
	// PutReserved is Put for a filled reservation, crc the CRC32C of its
	// bytes; it ends the reservation.
	PutReserved(ctx context.Context, key []byte, r *kvstore.Reservation, crc uint32, overwrite bool) (existed bool, err error)
}

// Local is a data server in the same process (internal/server.Server):
// keys it owns alone are served from its tiers directly, values sent from
// its DRAM pages without a copy.
type Local interface {
	ID() string
	KVOwner(pool string, key []byte) bool
	KVGetLocal(pool string, key []byte, fn func(bufs [][]byte, size int) error) error
	KVPutLocal(pool string, key, value []byte, crc uint32, overwrite bool) (existed bool, err error)
	KVReserveLocal(pool string, key []byte, size int64, overwrite bool) (*kvstore.Reservation, error)
	KVCommitReserved(pool string, key []byte, r *kvstore.Reservation, crc uint32, overwrite bool) (existed bool, moved []byte, err error)
	KVStatLocal(pool string, key []byte) (size int64, found bool)
	KVDeleteLocal(pool string, key []byte) (bool, error)
}

// Cluster serves a pool of the cluster's hash-mode KV cache: keys this
// process's server owns from its tiers (when Local is set), every other key
// through the Go client's KV path, forwarded to the owner. One key space.
type Cluster struct {
	Client *client.Client
	Pool   string
	Local  Local // nil in a gateway

	kv          *client.KV
	once        sync.Once
	lastRefresh atomic.Int64
	lastSize    atomic.Int64 // of the last value too large for the pooled buffer
}

func (c *Cluster) init() {
	c.once.Do(func() {
		if c.Pool == "" {
			c.Pool = "perf"
		}
		c.kv = c.Client.KV(c.Pool)
	})
}

// local reports whether key is served from the local tiers: only when the
// client's map and the server's agree that this server alone owns it. When
// they disagree (one of them is behind a membership change) the key goes
// through the binary protocol, whose epochs make the server catch up.
func (c *Cluster) local(ctx context.Context, key []byte) bool {
	if c.Local == nil {
		return false
	}
	ids, err := c.kv.Owners(ctx, string(key))
	return err == nil && len(ids) == 1 && ids[0] == c.Local.ID() && c.Local.KVOwner(c.Pool, key)
}

// unreachable refreshes the membership map (at most once a second) when an
// owner did not answer, so keys move on once the master marks it down.
func (c *Cluster) unreachable(err error) {
	if !errors.Is(err, errs.ErrUnavailable) {
		return
	}
	now := time.Now().UnixNano()
	last := c.lastRefresh.Load()
	if now-last < int64(time.Second) || !c.lastRefresh.CompareAndSwap(last, now) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Client.RefreshMembers(ctx)
	}()
}

func (c *Cluster) Get(ctx context.Context, key []byte, fn func(bufs [][]byte, size int) error) error {
	c.init()
	if c.local(ctx, key) {
		return c.Local.KVGetLocal(c.Pool, key, fn)
	}
	// Into a pooled buffer the size of the last value read (values of one
	// workload are usually alike): a fresh slice per GET costs allocating,
	// zeroing and collecting it, more than the copy off the socket. A
	// larger value fails the pooled read and is read again into a new slice.
	bp := bufpool.Get(int(max(c.lastSize.Load(), 64<<10)))
	defer bufpool.Put(bp)
	n, err := c.kv.GetInto(ctx, string(key), *bp)
	if errors.Is(err, errs.ErrTooLarge) {
		var v []byte
		if v, err = c.kv.Get(ctx, string(key)); err == nil {
			c.lastSize.Store(int64(len(v)))
			return fn([][]byte{v}, len(v))
		}
	}
	if err != nil {
		c.unreachable(err)
		return err
	}
	return fn([][]byte{(*bp)[:n]}, n)
}

func (c *Cluster) Put(ctx context.Context, key, value []byte, overwrite bool) (bool, error) {
	c.init()
	if c.local(ctx, key) {
		existed, err := c.Local.KVPutLocal(c.Pool, key, value, crc32.Checksum(value, crc32c.Table), overwrite)
		if !errors.Is(err, errs.ErrMoved) {
			return existed, err
		}
		// The map moved the key while this put landed (undone): its owner now.
	}
	existed, err := c.kv.PutWith(ctx, string(key), value, client.PutOptions{Overwrite: overwrite})
	c.unreachable(err)
	return existed, err
}

// Reserve returns pages of the local server's DRAM tier for a key it
// serves (nil for every other key, and where the local store has no room
// to spare: the value is then put the ordinary way).
func (c *Cluster) Reserve(ctx context.Context, key []byte, size int64, overwrite bool) (*kvstore.Reservation, error) {
	c.init()
	if !c.local(ctx, key) {
		return nil, nil
	}
	return c.Local.KVReserveLocal(c.Pool, key, size, overwrite)
}

// PutReserved stores a filled reservation on the local server, or, when
// the key's owner changed since Reserve, sends the value to its owner now.
func (c *Cluster) PutReserved(ctx context.Context, key []byte, r *kvstore.Reservation, crc uint32, overwrite bool) (bool, error) {
	existed, moved, err := c.Local.KVCommitReserved(c.Pool, key, r, crc, overwrite)
	if !errors.Is(err, errs.ErrMoved) || moved == nil {
		return existed, err
	}
	existed, err = c.kv.PutWith(ctx, string(key), moved, client.PutOptions{Overwrite: overwrite})
	c.unreachable(err)
	return existed, err
}

func (c *Cluster) Stat(ctx context.Context, key []byte) (int64, error) {
	c.init()
	if c.local(ctx, key) {
		n, ok := c.Local.KVStatLocal(c.Pool, key)
		if !ok {
			return 0, errs.New(errs.ErrNotFound, "")
		}
		return n, nil
	}
	info, err := c.kv.Stat(ctx, string(key))
	c.unreachable(err)
	return info.Size, err
}

func (c *Cluster) Delete(ctx context.Context, key []byte) (bool, error) {
	c.init()
	if c.local(ctx, key) {
		found, err := c.Local.KVDeleteLocal(c.Pool, key)
		if !errors.Is(err, errs.ErrMoved) {
			return found, err
		}
	}
	found, err := c.kv.DeleteFound(ctx, string(key))
	c.unreachable(err)
	return found, err
}

func (c *Cluster) Scan(ctx context.Context, cursor uint64, count int) ([]string, uint64, error) {
	c.init()
	return c.kv.Scan(ctx, cursor, count)
}

func (c *Cluster) Count(ctx context.Context) (int64, error) {
	c.init()
	return c.kv.Count(ctx)
}

// Retain changes key's pin, priority or TTL on its owners (the binary
// protocol: a rare command needs no fast path, and it finds a block that
// moved with a membership change as a read does).
func (c *Cluster) Retain(ctx context.Context, key []byte, o client.RetainOptions) (client.Retention, bool, error) {
	c.init()
	r, gone, err := c.kv.Retain(ctx, string(key), o)
	c.unreachable(err)
	return r, gone, err
}

// Retention returns key's pin, priority and TTL left.
func (c *Cluster) Retention(ctx context.Context, key []byte) (client.Retention, error) {
	c.init()
	r, err := c.kv.Retention(ctx, string(key))
	c.unreachable(err)
	return r, err
}
