package main

import (
	"time"

	"github.com/gd2fs/gd2fs/client"
)

// The JSON the CLI prints (--json): snake_case field names throughout, the
// same as the master's API and session/plan output, and no internal
// bookkeeping (a file's create_id attribute is the master's idempotency
// key for creates, not something a script should read).

type fileJSON struct {
	Path      string            `json:"path"`
	IsDir     bool              `json:"is_dir"`
	Pool      string            `json:"pool,omitempty"`
	ChunkSize int64             `json:"chunk_size,omitempty"`
	Size      int64             `json:"size"`
	Sealed    bool              `json:"sealed"`
	Modified  time.Time         `json:"modified"`
	Attrs     map[string]string `json:"attrs,omitempty"` // source, etag, sha256
	Chunks    []chunkJSON       `json:"chunks,omitempty"`
}

type chunkJSON struct {
	Index    int64         `json:"index"`
	Length   int64         `json:"length"`
	ID       uint64        `json:"id"`
	Replicas []replicaJSON `json:"replicas"`
}

type replicaJSON struct {
	Server string `json:"server"`
	Addr   string `json:"addr"`
	Up     bool   `json:"up"`
}

// internalAttrs are attributes the master keeps for itself.
var internalAttrs = map[string]bool{"create_id": true}

func fileOf(fi client.FileInfo) fileJSON {
	out := fileJSON{Path: fi.Path, IsDir: fi.IsDir, Pool: fi.Pool, ChunkSize: fi.ChunkSize, Size: fi.Size, Sealed: fi.Sealed, Modified: fi.Modified}
	for k, v := range fi.Attrs {
		if internalAttrs[k] {
			continue
		}
		if out.Attrs == nil {
			out.Attrs = map[string]string{}
		}
		out.Attrs[k] = v
	}
	for _, ch := range fi.Chunks {
		cj := chunkJSON{Index: ch.Index, Length: ch.Length, ID: ch.ID, Replicas: []replicaJSON{}}
		for _, r := range ch.Replicas {
			cj.Replicas = append(cj.Replicas, replicaJSON{Server: r.Server, Addr: r.Addr, Up: r.Up})
		}
		out.Chunks = append(out.Chunks, cj)
	}
	return out
}

type blockJSON struct {
	Key       string `json:"key"`
	Size      int64  `json:"size"`
	Tier      string `json:"tier"`
	Server    string `json:"server"`
	Pin       string `json:"pin"`      // "", "dram" or "disk"
	Priority  int    `json:"priority"` // -7 to 7
	TTLMillis int64  `json:"ttl_ms"`   // time left; 0: none
}

type existsJSON struct {
	Keys   []keyHitJSON `json:"keys"`
	Prefix int          `json:"prefix"` // leading keys all stored
}

type keyHitJSON struct {
	Key    string `json:"key"`
	Stored bool   `json:"stored"`
}

type cachedModelJSON struct {
	Name     string    `json:"name"`
	Bytes    int64     `json:"bytes"`
	LastUsed time.Time `json:"last_used"`
	Uses     int       `json:"uses"`
	InUse    bool      `json:"in_use"`
}

type cacheListJSON struct {
	Dir        string            `json:"dir"`
	Models     []cachedModelJSON `json:"models"`
	HitBytes   int64             `json:"hit_bytes"`     // warmups served from this cache
	Fetched    int64             `json:"fetched_bytes"` // from servers
	ColdFilled int64             `json:"cold_bytes"`    // of fetched, filled from S3 on the way
}

type modelFileJSON struct {
	Path    string           `json:"path"` // relative to the model folder
	Size    int64            `json:"size"`
	Sealed  bool             `json:"sealed"`
	Kind    string           `json:"kind"`             // pulled (sha256 recorded), linked (to source), or copied
	Source  string           `json:"source,omitempty"` // linked: the S3 object
	SHA256  string           `json:"sha256,omitempty"`
	Tensors int              `json:"tensors,omitempty"`
	DTypes  map[string]int64 `json:"dtype_bytes,omitempty"` // bytes per dtype
	Header  int64            `json:"header_bytes,omitempty"`
	List    []tensorJSON     `json:"tensor_list,omitempty"` // with --tensors
	Error   string           `json:"error,omitempty"`       // the safetensors header did not parse
}

type tensorJSON struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Bytes int64   `json:"bytes"`
}

type modelJSON struct {
	Dir        string          `json:"dir"`
	Files      []modelFileJSON `json:"files"`
	Bytes      int64           `json:"bytes"`
	Parameters int64           `json:"parameters"`
}
