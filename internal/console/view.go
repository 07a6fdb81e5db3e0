package console

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// View is one page, ready to show: every figure is already a string, so
// the template and the refresh script (static/console.js) only lay it out,
// and both put text in the DOM as text.
type View struct {
	Page     string     `json:"page"`
	Title    string     `json:"title"`
	Cluster  string     `json:"cluster"`
	Epoch    int64      `json:"epoch"`
	Updated  string     `json:"updated"`
	Menu     []MenuItem `json:"menu"`
	Banners  []Banner   `json:"banners"`
	Sections []Section  `json:"sections"`
	Search   *Search    `json:"search,omitempty"`
	// Version is the build shown in the footer (gd2fs --version).
	Version string `json:"version"`
	LogOut  bool   `json:"log_out"` // the cluster has a token: there is a login to leave
}

// MenuItem is a link to a page.
type MenuItem struct {
	Name    string `json:"name"`
	Title   string `json:"title"`
	Current bool   `json:"current"`
}

// Banner is an alert at the top of a page; Level is "warn" or "error".
type Banner struct {
	Level string `json:"level"`
	Text  string `json:"text"`
}

// Search is the session-id search form.
type Search struct {
	Value string `json:"value"`
}

// Section is a titled part of a page holding any of stat tiles, charts, a
// bar and a table.
type Section struct {
	ID     string  `json:"id"`
	Title  string  `json:"title"`
	Note   string  `json:"note,omitempty"`
	Stats  []Stat  `json:"stats,omitempty"`
	Charts []Chart `json:"charts,omitempty"`
	Bar    *Bar    `json:"bar,omitempty"`
	Table  *Table  `json:"table,omitempty"`
}

// Stat is one figure in a tile; Meter, when set (0..1), draws a gauge.
type Stat struct {
	ID    string   `json:"id"`
	Label string   `json:"label"`
	Value string   `json:"value"`
	Sub   string   `json:"sub,omitempty"`
	Meter *float64 `json:"meter,omitempty"`
}

// Table is a table of text cells.
type Table struct {
	ID    string   `json:"id"`
	Head  []string `json:"head"`
	Rows  [][]Cell `json:"rows"`
	Empty string   `json:"empty,omitempty"` // shown when there are no rows
}

// Cell is a table cell; Href, when set, is a console URL (/ui/...).
type Cell struct {
	Text  string `json:"text"`
	Title string `json:"title,omitempty"`
	Class string `json:"class,omitempty"`
	Href  string `json:"href,omitempty"`
}

// Chart is a small time-series chart in a W x H SVG box.
type Chart struct {
	ID    string `json:"id"`
	Title string `json:"title"`
	YMax  string `json:"ymax"`
	Span  string `json:"span"` // the time the x axis covers
	Lines []Line `json:"lines"`
	Empty string `json:"empty,omitempty"`
}

// Line is one series: an SVG path (gaps where there was no data) and its
// latest value.
type Line struct {
	Name  string `json:"name"`
	Class string `json:"class"` // s0..s3: colour
	D     string `json:"d"`
	Last  string `json:"last"`
}

// Bar lays ranges along an axis (a session's token ranges).
type Bar struct {
	ID    string `json:"id"`
	Axis  string `json:"axis"`
	Rects []Rect `json:"rects"`
}

// Rect is one range: X and W in percent of the bar.
type Rect struct {
	X     float64 `json:"x"`
	W     float64 `json:"w"`
	Class string  `json:"class"`
	Title string  `json:"title"`
}

// chart geometry, in SVG user units (the template and script use the same).
const chartW, chartH = 300.0, 80.0

// point is one value at one time; NaN is a gap.
type point struct {
	t time.Time
	v float64
}

// mkChart draws series sharing one y axis from 0 to the largest value
// (or yMax when > 0), over [from, to].
func mkChart(id, title, unit string, yMax float64, from, to time.Time, names []string, series [][]point, format func(float64) string) Chart {
	ch := Chart{ID: id, Title: title, Span: span(to.Sub(from))}
	top := yMax
	for _, s := range series {
		for _, p := range s {
			if !math.IsNaN(p.v) && p.v > top {
				top = p.v
			}
		}
	}
	if top <= 0 {
		top = 1
	}
	ch.YMax = format(top) + unit
	dt := to.Sub(from).Seconds()
	drawn := false
	for i, s := range series {
		var d strings.Builder
		pen, run := false, 0
		last := math.NaN()
		// A point with no neighbour is drawn as a dot: a zero-length segment
		// that the round line caps of console.css make visible.
		lone := func() {
			if run == 1 {
				d.WriteString("h0 ")
			}
			run = 0
		}
		for _, p := range s {
			if math.IsNaN(p.v) {
				pen = false
				lone()
				continue
			}
			run++
			x := chartW
			if dt > 0 {
				x = p.t.Sub(from).Seconds() / dt * chartW
			}
			y := chartH - p.v/top*chartH
			if pen {
				d.WriteString("L")
			} else {
				d.WriteString("M")
			}
			fmt.Fprintf(&d, "%s %s ", trimFloat(x), trimFloat(y))
			pen = true
			last = p.v
			drawn = true
		}
		lone()
		l := Line{Name: names[i], Class: "s" + strconv.Itoa(i%4), D: strings.TrimSpace(d.String()), Last: "–"}
		if !math.IsNaN(last) {
			l.Last = format(last) + unit
		}
		ch.Lines = append(ch.Lines, l)
	}
	if !drawn {
		ch.Empty = "no data yet: figures need two samples with activity"
	}
	return ch
}

func trimFloat(f float64) string { return strconv.FormatFloat(math.Round(f*10)/10, 'f', -1, 64) }

func span(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return d.Round(time.Second).String()
}

// bytes writes n in binary units, like the CLI.
func size(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	f, u := float64(n), -1
	for f >= 1024 && u < 5 {
		f /= 1024
		u++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + [...]string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}[u]
}

func count(n int64) string { return strconv.FormatInt(n, 10) }

func ratio(f float64) string {
	if math.IsNaN(f) {
		return "–"
	}
	return strconv.FormatFloat(f*100, 'f', 1, 64) + "%"
}

func rate(f float64) string {
	if math.IsNaN(f) {
		return "–"
	}
	if f >= 100 {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'f', 2, 64)
}

func millis(sec float64) string {
	if math.IsNaN(sec) {
		return "–"
	}
	ms := sec * 1000
	switch {
	case ms >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64)
	case ms >= 1:
		return strconv.FormatFloat(ms, 'f', 2, 64)
	}
	return strconv.FormatFloat(ms, 'f', 3, 64)
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	if d < time.Second {
		return "now"
	}
	if d < time.Minute {
		return d.Round(100*time.Millisecond).String() + " ago"
	}
	return d.Round(time.Second).String() + " ago"
}

func frac(used, capacity int64) *float64 {
	if capacity <= 0 {
		return nil
	}
	f := float64(used) / float64(capacity)
	return &f
}

func usedOf(used, capacity int64) string {
	if capacity <= 0 && used == 0 {
		return "–"
	}
	// A figure never breaks between its number and its unit.
	return strings.ReplaceAll(size(used), " ", "\u00a0") + " / " + strings.ReplaceAll(size(capacity), " ", "\u00a0")
}

func txt(s string) Cell { return Cell{Text: s} }
