package main

import (
	"fmt"
	"io"
	"os"
	"path"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/sys/unix"
)

// progressBars shows the progress of cp, model pull and warmup, one entry
// per file. On a terminal with a window size it draws bars (mpb); anywhere
// else (a file, a pipe, a pty without a size) it writes lines, because a
// bar drawn with cursor movements shows nothing there.
type progressBars struct {
	p     *mpb.Progress // bars: stderr is a sized terminal
	lines io.Writer     // lines: any other stderr
	mu    sync.Mutex
	bars  map[string]*mpb.Bar
	files map[string]*lineState
	start time.Time // for the rate in lines
}

// lineState is one file's progress in the line form.
type lineState struct {
	start       time.Time
	last        time.Time
	done, total int64
	decile      int64 // last tenth of total printed
	printed     int64 // done when last printed
}

func newProgressBars(show bool) *progressBars {
	return newProgressOn(show, os.Stderr, terminalWidth(os.Stderr) > 0)
}

// newProgressOn is newProgressBars on w; sized says whether w is a terminal
// with a window size.
func newProgressOn(show bool, w io.Writer, sized bool) *progressBars {
	switch {
	case !show:
		return &progressBars{}
	case sized:
		return &progressBars{p: mpb.New(mpb.WithOutput(w), mpb.WithWidth(30)), bars: map[string]*mpb.Bar{}}
	}
	return &progressBars{lines: w, files: map[string]*lineState{}, start: time.Now()}
}

// terminalWidth is f's terminal width in columns, 0 when it is not a
// terminal or has no size.
func terminalWidth(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}

// lineEvery is how often a line is written for a file whose progress does
// not cross a tenth of its size in between.
const lineEvery = 2 * time.Second

func (pb *progressBars) update(file string, done, total int64) {
	switch {
	case pb.p != nil:
		pb.mu.Lock()
		b := pb.bars[file]
		if b == nil {
			b = pb.p.AddBar(total, mpb.PrependDecorators(decor.Name(path.Base(file)+" "), decor.CountersKibiByte("% .1f / % .1f")),
				mpb.AppendDecorators(decor.AverageSpeed(decor.SizeB1024(0), " % .1f"), decor.Name(" "), decor.Percentage()))
			pb.bars[file] = b
		}
		pb.mu.Unlock()
		b.SetCurrent(done)
	case pb.lines != nil:
		pb.mu.Lock()
		defer pb.mu.Unlock()
		now := time.Now()
		st := pb.files[file]
		if st == nil {
			st = &lineState{start: pb.start, decile: -1}
			pb.files[file] = st
		}
		st.done, st.total = done, total
		decile := int64(0)
		if total > 0 {
			decile = done * 10 / total
		}
		if decile != st.decile || now.Sub(st.last) >= lineEvery {
			st.decile, st.last = decile, now
			pb.line(file, st, now)
		}
	}
}

// line writes one file's progress: "upload big.bin  16.0 MiB / 47.7 MiB  33%  120.0 MiB/s".
func (pb *progressBars) line(file string, st *lineState, now time.Time) {
	pct := 100
	if st.total > 0 {
		pct = int(st.done * 100 / st.total)
	}
	rate := ""
	if secs := now.Sub(st.start).Seconds(); secs > 0 {
		rate = "  " + human(int64(float64(st.done)/secs)) + "/s"
	}
	st.printed = st.done
	fmt.Fprintf(pb.lines, "%s  %s / %s  %d%%%s\n", path.Base(file), human(st.done), human(st.total), pct, rate)
}

func (pb *progressBars) wait() {
	switch {
	case pb.p != nil:
		for _, b := range pb.bars {
			b.SetTotal(-1, true)
		}
		pb.p.Wait()
	case pb.lines != nil:
		pb.mu.Lock()
		defer pb.mu.Unlock()
		for file, st := range pb.files {
			if st.printed != st.done { // the last figure always shows
				pb.line(file, st, time.Now())
			}
		}
	}
}

// showProgress says whether to show progress: always with --progress, never
// with -q, else when stderr is a terminal.
func showProgress(force, quiet bool) bool {
	if quiet {
		return false
	}
	if force {
		return true
	}
	fi, err := os.Stderr.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
