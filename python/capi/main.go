// Command capi is libgd2fs.so.1, the shared library under pygd2fs:
//
//	go build -buildmode=c-shared -o python/pygd2fs/libgd2fs.so.1 ./python/capi
//
// It exports the Go client to C (and so to Python's ctypes) as a handful of
// functions over package bridge. This file only converts: C strings and
// arrays to Go values, caller memory to []byte, errors to status codes and
// malloc'd messages. Every exported function recovers from panics, since a
// panic would take the Python process down with it.
//
// Conventions: a client is an int64 handle (> 0). Functions return a
// non-negative result or minus a status code (bridge.Code*), and then set
// *err to a malloc'd message that the caller frees with gd2fs_free.
package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/python/bridge"
)

func main() {}

var (
	mu      sync.Mutex
	next    int64
	engines = map[int64]*bridge.Engine{}
)

func engine(h C.int64_t) (*bridge.Engine, error) {
	mu.Lock()
	defer mu.Unlock()
	e := engines[int64(h)]
	if e == nil {
		return nil, errs.New(errs.ErrBadRequest, "client %d is closed", int64(h))
	}
	return e, nil
}

// fail stores err's message in *out and returns minus its code.
func fail(out **C.char, err error) C.int64_t {
	if out != nil {
		*out = C.CString(err.Error())
	}
	return C.int64_t(-bridge.Code(err))
}

// guard turns a panic into an Internal error result.
func guard(res *C.int64_t, out **C.char) {
	if p := recover(); p != nil {
		*res = fail(out, errs.New(errs.ErrInternal, "libgd2fs: panic: %v", p))
	}
}

func bytesAt(p unsafe.Pointer, n C.int64_t) []byte {
	if n <= 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(p), int(n))
}

//export gd2fs_new
func gd2fs_new(cpaddr, dpaddr, cluster, token *C.char, iothreads, memthreads, streams C.int, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := bridge.New(bridge.Config{CPAddr: C.GoString(cpaddr), DPAddr: C.GoString(dpaddr), Cluster: C.GoString(cluster),
		Token: C.GoString(token), IOThreads: int(iothreads), MemThreads: int(memthreads), Streams: int(streams)})
	if err != nil {
		return fail(out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	next++
	engines[next] = e
	return C.int64_t(next)
}

//export gd2fs_close
func gd2fs_close(h C.int64_t) (res C.int64_t) {
	defer guard(&res, nil)
	mu.Lock()
	e := engines[int64(h)]
	delete(engines, int64(h))
	mu.Unlock()
	if e != nil {
		e.Close()
	}
	return 0
}

//export gd2fs_cluster
func gd2fs_cluster(h C.int64_t, out, errOut **C.char) (res C.int64_t) {
	defer guard(&res, errOut)
	e, err := engine(h)
	if err != nil {
		return fail(errOut, err)
	}
	*out = C.CString(e.Cluster())
	return 0
}

//export gd2fs_free
func gd2fs_free(p unsafe.Pointer) { C.free(p) }

//export gd2fs_reg_iomem
func gd2fs_reg_iomem(h C.int64_t, p unsafe.Pointer, n C.int64_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	id, err := e.RegIOMEM(p, int64(n))
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(id)
}

//export gd2fs_dereg_iomem
func gd2fs_dereg_iomem(h C.int64_t, id C.int64_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	if err := e.DeregIOMEM(uint64(id)); err != nil {
		return fail(out, err)
	}
	return 0
}

// gd2fs_submit starts a transfer of n SGEs (addrs[i], lens[i] inside IOMEM
// iomems[i]) and returns its id.
//
//export gd2fs_submit
func gd2fs_submit(h C.int64_t, op C.int, path *C.char, off C.int64_t, addrs *unsafe.Pointer, lens, iomems *C.int64_t, n C.int,
	flags C.uint32_t, opts *C.char, queue C.int, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	if n < 0 || n > 1<<20 {
		return fail(out, errs.New(errs.ErrBadRequest, "%d SGEs: want 1..%d", int(n), 1<<20))
	}
	segs := make([]bridge.Seg, int(n))
	if n > 0 {
		as := unsafe.Slice(addrs, int(n))
		ls := unsafe.Slice(lens, int(n))
		ms := unsafe.Slice(iomems, int(n))
		for i := range segs {
			segs[i] = bridge.Seg{Ptr: as[i], Len: int64(ls[i]), IOMEM: uint64(ms[i])}
		}
	}
	id, err := e.Submit(bridge.Op(op), C.GoString(path), int64(off), segs, uint32(flags), C.GoString(opts), int(queue))
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(id)
}

//export gd2fs_cancel
func gd2fs_cancel(h C.int64_t, id C.int64_t) (res C.int64_t) {
	defer guard(&res, nil)
	if e, err := engine(h); err == nil {
		e.Cancel(uint64(id))
	}
	return 0
}

// gd2fs_wait collects up to max completed transfers of queue into ids,
// status, values and msgs (malloc'd, NULL on success), waiting up to
// timeoutMs (< 0: until one completes while any is in flight).
//
//export gd2fs_wait
func gd2fs_wait(h C.int64_t, queue C.int, timeoutMs C.int64_t, ids, status, values *C.int64_t, msgs **C.char, max C.int, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	if max <= 0 {
		return 0
	}
	rs, err := e.Wait(int(queue), time.Duration(timeoutMs)*time.Millisecond, int(max))
	if err != nil {
		return fail(out, err)
	}
	is, ss, vs, ms := unsafe.Slice(ids, int(max)), unsafe.Slice(status, int(max)), unsafe.Slice(values, int(max)), unsafe.Slice(msgs, int(max))
	for i, r := range rs {
		is[i], ss[i], vs[i] = C.int64_t(r.ID), C.int64_t(r.Status), C.int64_t(r.Value)
		ms[i] = nil
		if r.Err != "" {
			ms[i] = C.CString(r.Err)
		}
	}
	return C.int64_t(len(rs))
}

//export gd2fs_fd
func gd2fs_fd(h C.int64_t, queue C.int, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	fd, err := e.Fd(int(queue))
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(fd)
}

//export gd2fs_read_into
func gd2fs_read_into(h C.int64_t, path *C.char, off C.int64_t, p unsafe.Pointer, n C.int64_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	k, err := e.ReadInto(C.GoString(path), int64(off), bytesAt(p, n))
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(k)
}

//export gd2fs_write_from
func gd2fs_write_from(h C.int64_t, path *C.char, off C.int64_t, p unsafe.Pointer, n C.int64_t, opts *C.char, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	k, err := e.WriteFrom(C.GoString(path), int64(off), bytesAt(p, n), C.GoString(opts))
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(k)
}

//export gd2fs_file_open
func gd2fs_file_open(h C.int64_t, path, mode, opts *C.char, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	id, err := e.OpenFile(C.GoString(path), C.GoString(mode), C.GoString(opts))
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(id)
}

// gd2fs_file_io reads (write == 0) or writes n bytes at p at off of file fh.
//
//export gd2fs_file_io
func gd2fs_file_io(h, fh C.int64_t, write C.int, p unsafe.Pointer, n, off C.int64_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	if off < 0 {
		return fail(out, errs.New(errs.ErrBadRequest, "negative offset %d", int64(off)))
	}
	var k int64
	if write != 0 {
		k, err = e.FileWriteAt(uint64(fh), bytesAt(p, n), int64(off))
	} else {
		k, err = e.FileReadAt(uint64(fh), bytesAt(p, n), int64(off))
	}
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(k)
}

//export gd2fs_file_size
func gd2fs_file_size(h, fh C.int64_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	n, err := e.FileSize(uint64(fh))
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(n)
}

//export gd2fs_file_close
func gd2fs_file_close(h, fh C.int64_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	if err := e.FileClose(uint64(fh)); err != nil {
		return fail(out, err)
	}
	return 0
}

// keys splits a blob of n keys of lens[i] bytes each.
func keys(blob *C.char, lens *C.int64_t, n C.int) ([]string, error) {
	if n < 0 || n > 1<<24 {
		return nil, errs.New(errs.ErrBadRequest, "%d keys", int(n))
	}
	ks := make([]string, int(n))
	if n == 0 {
		return ks, nil
	}
	ls := unsafe.Slice(lens, int(n))
	p := unsafe.Pointer(blob)
	for i := range ks {
		if ls[i] < 0 || ls[i] > 1<<20 {
			return nil, errs.New(errs.ErrBadRequest, "key %d: length %d", i, int64(ls[i]))
		}
		ks[i] = string(bytesAt(p, ls[i]))
		p = unsafe.Add(p, int(ls[i]))
	}
	return ks, nil
}

func bufs(ptrs *unsafe.Pointer, sizes *C.int64_t, n C.int) ([][]byte, error) {
	bs := make([][]byte, int(n))
	if n == 0 {
		return bs, nil
	}
	ps, ss := unsafe.Slice(ptrs, int(n)), unsafe.Slice(sizes, int(n))
	for i := range bs {
		if ss[i] < 0 || (ss[i] > 0 && ps[i] == nil) {
			return nil, errs.New(errs.ErrBadRequest, "buffer %d: address %p size %d", i, ps[i], int64(ss[i]))
		}
		bs[i] = bytesAt(ps[i], ss[i])
		if bs[i] == nil {
			bs[i] = []byte{}
		}
	}
	return bs, nil
}

//export gd2fs_kv_put
func gd2fs_kv_put(h C.int64_t, pool, key *C.char, keyLen C.int64_t, p unsafe.Pointer, n C.int64_t, overwrite C.int, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	v := bytesAt(p, n)
	if v == nil {
		v = []byte{}
	}
	existed, err := e.KVPut(C.GoString(pool), string(bytesAt(unsafe.Pointer(key), keyLen)), v, overwrite != 0)
	if err != nil {
		return fail(out, err)
	}
	if existed {
		return 1
	}
	return 0
}

//export gd2fs_kv_get_into
func gd2fs_kv_get_into(h C.int64_t, pool, key *C.char, keyLen C.int64_t, p unsafe.Pointer, n C.int64_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	dst := bytesAt(p, n)
	if dst == nil {
		dst = []byte{}
	}
	k, err := e.KVGetInto(C.GoString(pool), string(bytesAt(unsafe.Pointer(key), keyLen)), dst)
	if err != nil {
		return fail(out, err)
	}
	return C.int64_t(k)
}

// gd2fs_kv_get returns the value's length and sets *val to a malloc'd copy.
//
//export gd2fs_kv_get
func gd2fs_kv_get(h C.int64_t, pool, key *C.char, keyLen C.int64_t, val *unsafe.Pointer, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	v, err := e.KVGet(C.GoString(pool), string(bytesAt(unsafe.Pointer(key), keyLen)))
	if err != nil {
		return fail(out, err)
	}
	*val = C.CBytes(v)
	return C.int64_t(len(v))
}

//export gd2fs_kv_batch
func gd2fs_kv_batch(h C.int64_t, put C.int, pool, blob *C.char, keyLens *C.int64_t, n C.int, ptrs *unsafe.Pointer, sizes, results *C.int64_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	ks, err := keys(blob, keyLens, n)
	if err != nil {
		return fail(out, err)
	}
	bs, err := bufs(ptrs, sizes, n)
	if err != nil {
		return fail(out, err)
	}
	var rs []int64
	if put != 0 {
		rs, err = e.KVBatchPut(C.GoString(pool), ks, bs)
	} else {
		rs, err = e.KVBatchGetInto(C.GoString(pool), ks, bs)
	}
	if err != nil {
		return fail(out, err)
	}
	if n > 0 {
		o := unsafe.Slice(results, int(n))
		for i, r := range rs {
			o[i] = C.int64_t(r)
		}
	}
	return 0
}

//export gd2fs_kv_batch_exists
func gd2fs_kv_batch_exists(h C.int64_t, pool, blob *C.char, keyLens *C.int64_t, n C.int, hits *C.uint8_t, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	ks, err := keys(blob, keyLens, n)
	if err != nil {
		return fail(out, err)
	}
	hs, prefix, err := e.KVBatchExists(C.GoString(pool), ks)
	if err != nil {
		return fail(out, err)
	}
	if n > 0 {
		o := unsafe.Slice(hits, int(n))
		for i, ok := range hs {
			o[i] = 0
			if ok {
				o[i] = 1
			}
		}
	}
	return C.int64_t(prefix)
}

// gd2fs_call runs a control-plane call with JSON params; *res_json is the
// malloc'd JSON answer.
//
//export gd2fs_call
func gd2fs_call(h C.int64_t, method, params *C.char, resJSON, out **C.char) (res C.int64_t) {
	defer guard(&res, out)
	e, err := engine(h)
	if err != nil {
		return fail(out, err)
	}
	b, err := e.Call(C.GoString(method), []byte(C.GoString(params)))
	if err != nil {
		return fail(out, err)
	}
	*resJSON = C.CString(string(b))
	return 0
}

// gd2fs_version names the library build.
//
//export gd2fs_version
func gd2fs_version() *C.char {
	return C.CString(fmt.Sprintf("libgd2fs (bridge codes 0..%d)", bridge.CodeTimeout))
}
