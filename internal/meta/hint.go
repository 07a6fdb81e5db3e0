package meta

// ChunkHinter is implemented by stores that can tell a file's chunks from
// the leader's memory (the session table's files, cache.go) without
// reading SQL: for hints only, such as the master warming a plan's stored
// ranges, where a chunk missing or a replica list just moved costs one
// useless or missed copy into DRAM, never a wrong answer.
type ChunkHinter interface {
	// HintChunks returns path's file and the chunks memory holds of it,
	// ordered by index; ok false when memory does not hold the file (the
	// caller reads SQL). Memory may hold fewer chunks, or shorter ones,
	// than SQL; a file whose replicas moved is dropped from it.
	HintChunks(path string) (f File, cs []Chunk, ok bool)
}

func (s *sqlStore) HintChunks(path string) (File, []Chunk, bool) {
	s.wb.mu.Lock()
	defer s.wb.mu.Unlock()
	if !s.fastReady() {
		return File{}, nil, false
	}
	cf, ok := s.cache.files[path]
	if !ok {
		return File{}, nil, false
	}
	f, cs := cf.snapshot()
	return f, cs, true
}
