package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// DiskWrite is the disk's limit for a write case, measured in the same run:
// writers parallel sequential writers each write per bytes in 4 MiB writes
// to their own new file under dir, with an fdatasync after every syncEvery
// bytes and at the end (syncEvery 0: none, the page cache only). It runs
// fio when it is installed (Debian package fio) and otherwise a Go writer
// doing the same; tool says which. The result is the bytes of all writers
// per second.
func DiskWrite(dir string, writers int, per, syncEvery int64) (bytesPerSec float64, tool string, err error) {
	if writers <= 0 || per <= 0 || syncEvery < 0 {
		return 0, "", fmt.Errorf("bench: disk reference of %d writers x %d bytes, sync every %d", writers, per, syncEvery)
	}
	const bs = 4 << 20
	sub, err := os.MkdirTemp(dir, "diskref-")
	if err != nil {
		return 0, "", err
	}
	defer os.RemoveAll(sub)
	if fio, lerr := exec.LookPath("fio"); lerr == nil {
		v, err := runFio(fio, sub, writers, per, bs, syncEvery, false, false)
		return v, "fio", err
	}
	v, err := goDiskWrite(sub, writers, per, bs, syncEvery)
	return v, "Go writer (fio not installed)", err
}

// DiskWriteDirect is DiskWrite past the page cache (fio --direct=1): the
// limit of writes that go to the disk tier with O_DIRECT, as the servers'
// zero-copy writes do. With flush, each writer ends with an fsync
// (--end_fsync=1): on a device with a write cache (a VM's virtual disk) an
// O_DIRECT write is done once the cache has it, and the flush is when the
// device holds it. ok is false without fio.
func DiskWriteDirect(dir string, writers int, per int64, flush bool) (bytesPerSec float64, ok bool, err error) {
	fio, lerr := exec.LookPath("fio")
	if lerr != nil {
		return 0, false, nil
	}
	if writers <= 0 || per <= 0 {
		return 0, false, fmt.Errorf("bench: disk reference of %d writers x %d bytes", writers, per)
	}
	sub, err := os.MkdirTemp(dir, "diskref-")
	if err != nil {
		return 0, false, err
	}
	defer os.RemoveAll(sub)
	const bs = 4 << 20
	v, err := runFio(fio, sub, writers, (per+bs-1)/bs*bs, bs, 0, true, flush)
	return v, err == nil, err
}

func runFio(fio, dir string, writers int, per, bs, syncEvery int64, direct, endSync bool) (float64, error) {
	args := []string{"--name=ref", "--directory=" + dir, "--rw=write", "--ioengine=psync",
		"--bs=" + strconv.FormatInt(bs, 10), "--size=" + strconv.FormatInt(per, 10),
		"--numjobs=" + strconv.Itoa(writers), "--group_reporting", "--output-format=json"}
	if direct {
		args = append(args, "--direct=1")
	}
	if syncEvery > 0 {
		args = append(args, "--fdatasync="+strconv.FormatInt(max(1, syncEvery/bs), 10))
	}
	if syncEvery > 0 || endSync {
		args = append(args, "--end_fsync=1")
	}
	out, err := exec.Command(fio, args...).Output()
	if err != nil {
		return 0, fmt.Errorf("bench: fio %v: %w", args, err)
	}
	var r struct {
		Jobs []struct {
			Write struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Jobs) == 0 {
		return 0, fmt.Errorf("bench: fio printed no result (%v): %.200s", err, out)
	}
	return r.Jobs[0].Write.BwBytes, nil
}

func goDiskWrite(dir string, writers int, per, bs, syncEvery int64) (float64, error) {
	buf := loopBuffers(1)[0][:bs]
	errc := make(chan error, writers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("w%d", i)))
			if err != nil {
				errc <- err
				return
			}
			defer f.Close()
			var since int64
			for done := int64(0); done < per; {
				n := min(bs, per-done)
				if _, err := f.Write(buf[:n]); err != nil {
					errc <- err
					return
				}
				done, since = done+n, since+n
				if syncEvery > 0 && (since >= syncEvery || done == per) {
					if err := syscall.Fdatasync(int(f.Fd())); err != nil {
						errc <- err
						return
					}
					since = 0
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	select {
	case err := <-errc:
		return 0, err
	default:
	}
	return float64(per*int64(writers)) / el.Seconds(), nil
}

// Memmove copies src into dst (as large as src) and returns bytes/second:
// the ceiling of any path that touches each byte once in memory.
func Memmove(dst, src []byte) float64 {
	start := time.Now()
	copy(dst, src)
	return float64(len(src)) / time.Since(start).Seconds()
}
