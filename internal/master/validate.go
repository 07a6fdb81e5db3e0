package master

import (
	"context"
	"net"
	"net/http"
	"sort"
	"strings"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

// checkHeartbeat refuses a heartbeat before it changes anything, in memory
// or in the store: a server id follows the name rule, its address is
// host:port, the rest is text PostgreSQL can hold (issue 22 finding 10: a
// refused "x\x00" was left up in memory).
func checkHeartbeat(hb api.Heartbeat) error {
	if hb.ID == "" || hb.Addr == "" {
		return errs.New(errs.ErrBadRequest, "heartbeat needs id and addr")
	}
	if err := nspath.CheckName("server id", hb.ID); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(hb.Addr); err != nil {
		return errs.New(errs.ErrBadRequest, "heartbeat addr %.64q: want host:port (%v)", hb.Addr, err)
	}
	for _, s := range []string{hb.Addr, hb.Unhealthy} {
		if err := nspath.CheckText("heartbeat", s); err != nil {
			return err
		}
	}
	return nil
}

// checkCommit refuses a file commit that claims bytes no server can hold
// (issue 22 finding 15: 10 bytes never written, with chunk indexes -1 and
// 99999, were accepted, and a later read waited for a server that never
// had them): every length must be of a chunk the file has allocated and
// within its chunk size, the size must not reach past the bytes the
// chunks' lengths (stored, or in this commit) account for, and every
// replica of a chunk the commit makes longer must hold that many bytes.
func (m *Master) checkCommit(ctx context.Context, f meta.File, req api.CommitRequest) error {
	if f.Sealed || (len(req.Lengths) == 0 && req.Size <= f.Size) {
		return nil // the store answers "sealed"; or a seal, or a commit of what is known
	}
	chunks, err := m.meta.Chunks(ctx, f.ID)
	if err != nil {
		return err
	}
	return m.checkCommitOn(ctx, f, chunks, req)
}

// checkCommitOn is checkCommit on the file's chunks as the caller read
// them.
func (m *Master) checkCommitOn(ctx context.Context, f meta.File, chunks []meta.Chunk, req api.CommitRequest) error {
	if f.Sealed || (len(req.Lengths) == 0 && req.Size <= f.Size) {
		return nil
	}
	have := make(map[int64]int64, len(chunks))
	grown := map[int64]int64{}
	var extent int64
	for _, c := range chunks {
		have[c.Index] = c.Length
		extent = max(extent, c.Index*f.ChunkSize+c.Length)
	}
	for idx, n := range req.Lengths {
		if _, ok := have[idx]; !ok {
			return errs.New(errs.ErrBadRequest, "commit of %s: chunk %d was never allocated (alloc it and write it first)", f.Path, idx)
		}
		if n < 0 || n > f.ChunkSize {
			return errs.New(errs.ErrBadRequest, "commit of %s: chunk %d length %d is outside 0..%d", f.Path, idx, n, f.ChunkSize)
		}
		extent = max(extent, idx*f.ChunkSize+n)
		if n > have[idx] {
			grown[idx] = n
		}
	}
	if req.Size > max(extent, f.Size) {
		return errs.New(errs.ErrBadRequest, "commit of %s: size %d reaches past the %d bytes its chunks hold", f.Path, req.Size, max(extent, f.Size))
	}
	return m.checkChunksHeld(ctx, f, chunks, grown) // written.go: the servers' word
}

// checkS3Source is the rule for a link's source (issue 22 finding 17:
// s3://../../etc/passwd was accepted): s3://BUCKET/KEY with a bucket name
// of letters, digits, '.', '-', '_' (not "." or ".."; S3-compatible stores
// differ in the rest), and a key of printable UTF-8 with no "." or ".."
// segment.
func checkS3Source(uri string) error {
	rest, ok := strings.CutPrefix(uri, "s3://")
	bucket, key, _ := strings.Cut(rest, "/")
	bad := func(why string) error {
		return errs.New(errs.ErrBadRequest, "link source %.200q: %s; want s3://BUCKET/KEY", uri, why)
	}
	if !ok {
		return bad("not an s3:// URI")
	}
	if bucket == "" || bucket == "." || bucket == ".." || len(bucket) > 255 {
		return bad("no bucket name")
	}
	for _, c := range bucket {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return bad("a bucket name is letters, digits, '.', '-' and '_'")
		}
	}
	if key == "" {
		return bad("no key")
	}
	if err := nspath.CheckText("link source", key); err != nil {
		return err
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "." || seg == ".." {
			return bad("'.' and '..' are not key segments")
		}
	}
	for _, c := range key {
		if c < 0x20 || c == 0x7f {
			return bad("control characters in the key")
		}
	}
	return nil
}

// pageEntries cuts a listing to ?limit= entries (1 … limits.MaxListLimit;
// absent: all, as before) whose paths sort after ?after=, and says the
// ?after= of the next page when there is one (issue 22 finding 17: 11.5k
// entries were one 1.3 MB answer).
func pageEntries(r *http.Request, es []meta.Entry) ([]meta.Entry, string, error) {
	limit, err := queryInt(r, "limit", 0, 1, limits.MaxListLimit)
	if err != nil {
		return nil, "", err
	}
	after := r.URL.Query().Get("after")
	if err := nspath.CheckText("?after", after); err != nil {
		return nil, "", err
	}
	if limit == 0 && after == "" {
		return es, "", nil
	}
	sort.Slice(es, func(i, j int) bool { return es[i].Path < es[j].Path })
	i := sort.Search(len(es), func(i int) bool { return es[i].Path > after })
	es = es[i:]
	if limit == 0 || len(es) <= limit {
		return es, "", nil
	}
	return es[:limit], es[limit-1].Path, nil
}
