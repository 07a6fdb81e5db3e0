// Package meta is the master's metadata store: namespace (directories, files,
// chunks, replicas), servers, pools, the membership epoch, and chunk
// deletions owed by servers. One SQL implementation runs on two engines:
// SQLite (modernc.org/sqlite, embedded, the default) and PostgreSQL (pgx);
// conformance_test.go runs the same suite against both.
package meta

import (
	"context"
	"time"
)

// File is a regular file's metadata.
type File struct {
	ID        int64
	Path      string
	Pool      string
	ChunkSize int64
	Size      int64
	Sealed    bool
	Modified  time.Time
	// CreateID, given to CreateFile, is stored with the file in the same
	// transaction as the attribute CreateIDAttr: a master that retries a
	// create after a lost answer recognises the file it made.
	CreateID string
}

// CreateIDAttr is the attribute holding a file's CreateID.
const CreateIDAttr = "create_id"

// Entry is one name in a directory listing.
type Entry struct {
	Path  string
	IsDir bool
	File  File // zero for directories
}

// Chunk is one chunk of a file and the servers holding it.
type Chunk struct {
	ID       uint64
	FileID   int64
	Index    int64
	Length   int64
	Replicas []string // server ids, primary first
}

// Server is a registered data server.
type Server struct {
	ID      string
	Addr    string
	MemCap  int64
	DiskCap int64
}

// Pool is a replication policy.
type Pool struct {
	Name     string
	Replicas int
}

// Placed is a chunk with its file's pool, for re-replication.
type Placed struct {
	Chunk
	Pool string
}

// Store is the whole metadata store: the four interfaces below, one per
// consumer inside the master, over one database. Errors wrap errs
// sentinels. A consumer that needs only part of it takes the small
// interface (the session handlers take Sessions, the plan benchmark
// Sessions and Namespace).
type Store interface {
	Close() error
	Leadership
	Membership
	Namespace
	Sessions
}

// Leadership elects one master among several on one database.
type Leadership interface {
	// Lead tries to make this store's master the leader (recording url) and
	// reports whether it leads; Leader is the url the leader recorded.
	Lead(ctx context.Context, url string) (bool, error)
	Leader(ctx context.Context) (string, error)
}

// Membership is the servers, pools and epoch of the membership map, where
// each server's chunks are, and the chunk deletions servers owe.
type Membership interface {
	Epoch(ctx context.Context) (int64, error)
	BumpEpoch(ctx context.Context) (int64, error)

	PutServer(ctx context.Context, s Server) error
	Servers(ctx context.Context) ([]Server, error)
	PutPool(ctx context.Context, p Pool) error
	Pools(ctx context.Context) ([]Pool, error)

	ChunksOn(ctx context.Context, serverID string) ([]Placed, error)
	// ReplaceReplica swaps server old for new in a chunk's replica list.
	ReplaceReplica(ctx context.Context, chunkID uint64, old, new string) error

	Tombstones(ctx context.Context, serverID string, limit int) ([]uint64, error)
	// Orphans tombstones the chunks in held that serverID should not hold.
	Orphans(ctx context.Context, serverID string, held []uint64) (int, error)
	ClearTombstones(ctx context.Context, serverID string, ids []uint64) error

	// SaveKVHistory and KVHistory keep the master's hash-mode KV membership
	// history (earlier member lists, servers being drained; kvhistory.go),
	// so a restarted or new leader carries on moves in progress.
	SaveKVHistory(ctx context.Context, state []byte) error
	KVHistory(ctx context.Context) ([]byte, error)
}

// Namespace is directories, files, their chunks and attributes.
type Namespace interface {
	Mkdir(ctx context.Context, path string, now time.Time) error
	RemoveDir(ctx context.Context, path string) error
	CreateFile(ctx context.Context, f File) (File, error)
	File(ctx context.Context, path string) (File, error)
	IsDir(ctx context.Context, path string) (bool, error)
	List(ctx context.Context, dir string) ([]Entry, error)
	// RemoveFile deletes a file and records a tombstone for every replica of
	// its chunks, in one transaction.
	RemoveFile(ctx context.Context, path string) error
	// Rename moves a sealed file, or a directory with all under it, to a
	// new name in one transaction (rename.go has the rules).
	Rename(ctx context.Context, from, to string, o RenameOptions, now time.Time) error
	// ExpireUnsealed removes up to limit unsealed files last written
	// before before (their writers died: unsealed.go) and returns them.
	ExpireUnsealed(ctx context.Context, before time.Time, limit int) ([]File, error)
	// Commit sets the size and chunk lengths (only ever growing them) and
	// optionally seals the file.
	Commit(ctx context.Context, fileID int64, size int64, lengths map[int64]int64, seal bool, now time.Time) (File, error)

	// AddChunks inserts the chunks whose index is not yet allocated, giving
	// them fresh ids, and returns the chunks at all asked indexes.
	AddChunks(ctx context.Context, fileID int64, want []Chunk) ([]Chunk, error)
	Chunks(ctx context.Context, fileID int64) ([]Chunk, error)

	Totals(ctx context.Context) (files, bytes int64, err error)

	// File attributes (cold source, etag, sha256 of model files).
	SetAttrs(ctx context.Context, path string, attrs map[string]string) error
	Attrs(ctx context.Context, path string) (map[string]string, error)
}

// Sessions is explicit-mode KV: layouts, shared prefixes, sessions and their
// plans (sessions.go).
type Sessions interface {
	PutLayout(ctx context.Context, l Layout) error
	Layout(ctx context.Context, model string) (Layout, error)
	PutPrefix(ctx context.Context, p Prefix) error
	PlanSession(ctx context.Context, in PlanInput) (Plan, error)
	CommitSession(ctx context.Context, in CommitInput) (Session, error)
	ForkSession(ctx context.Context, src, dst, requestID string, now time.Time) error
	DeleteSession(ctx context.Context, id string) error
	Session(ctx context.Context, id string) (Session, error)
	Sessions(ctx context.Context, after string, limit int) ([]Session, error)
}
