package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU time per GiB moved is the figure that does not depend on what else
// runs on the machine: throughput on a shared machine swings with the
// neighbours' load, the work done per byte does not. Every benchmark that
// reports a throughput reports it too, for gd2fs and for its reference,
// summed over every process involved (the benchmark process itself, which
// runs the clients, and each server process).

// clockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// which Linux fixes at 100 on every architecture gd2fs runs on.
const clockTick = 10 * time.Millisecond

// procStat is the fields of /proc/<pid>/stat from field 3 (state) on. The
// command name (field 2) is in parentheses and may hold spaces: fields are
// counted from the last ')'.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return f, nil
}

// procCPU is the user+sys CPU time pid has used so far, all its threads
// (os.Getpid() for this process): utime and stime, fields 14 and 15.
func procCPU(pid int) (time.Duration, error) { return procTicks(pid, 14) }

// procReapedCPU is the user+sys CPU time of pid's children that ended and
// were waited for: cutime and cstime, fields 16 and 17.
func procReapedCPU(pid int) (time.Duration, error) { return procTicks(pid, 16) }

// procTicks is the sum of fields field and field+1 of /proc/<pid>/stat
// (numbered from 1 as in proc(5)), clock ticks, as a duration.
func procTicks(pid, field int) (time.Duration, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	i := field - 3 // procStat's fields start at the third, the state
	if i < 0 || i+1 >= len(f) {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields, no field %d", pid, len(f)+2, field+1)
	}
	a, err1 := strconv.ParseInt(f[i], 10, 64)
	b, err2 := strconv.ParseInt(f[i+1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad fields %d and %d: %q %q", pid, field, field+1, f[i], f[i+1])
	}
	return time.Duration(a+b) * clockTick, nil
}

// cpuMeter measures the CPU time a set of processes uses between Start
// and Stop.
type cpuMeter struct {
	pids  []int
	start time.Duration
}

// newCPUMeter meters this process and pids.
func newCPUMeter(pids ...int) *cpuMeter {
	return &cpuMeter{pids: append([]int{os.Getpid()}, pids...)}
}

func (m *cpuMeter) total() time.Duration {
	var sum time.Duration
	for _, p := range m.pids {
		if d, err := procCPU(p); err == nil {
			sum += d
		}
	}
	return sum
}

// Start begins a measurement.
func (m *cpuMeter) Start() { m.start = m.total() }

// Stop ends it and returns the CPU seconds per GiB for bytes moved.
func (m *cpuMeter) Stop(bytes int64) float64 {
	if bytes <= 0 {
		return 0
	}
	return (m.total() - m.start).Seconds() / (float64(bytes) / (1 << 30))
}

// procIO is process pid's I/O counters from /proc/PID/io (Linux): the
// write and read system calls it made (syscw, syscr: files and sockets
// alike) and the bytes they wrote (wchar). ok false where there is none.
func procIO(pid int) (writes, reads, wbytes int64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, found := strings.Cut(line, ": ")
		if !found {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "syscw":
			writes = n
		case "syscr":
			reads = n
		case "wchar":
			wbytes = n
		}
	}
	return writes, reads, wbytes, true
}
