// Package s3test runs an S3-compatible server (gofakes3, in memory) on a
// loopback port for tests and benchmarks. It speaks real HTTP, counts the
// object bytes it sends, checks the access key, and can fail on demand (go
// down, or cut a response after some bytes) to test retries and resumes.
package s3test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Server is a running fake S3.
type Server struct {
	URL       string // http://127.0.0.1:port
	AccessKey string
	SecretKey string

	backend *s3mem.Backend
	srv     *httptest.Server

	sent      atomic.Int64 // object bytes sent in GET responses
	gets      atomic.Int64
	requests  atomic.Int64 // every request, answered or refused
	failAfter atomic.Int64 // cut a response once this many more bytes went; <0 off
	down      atomic.Bool
	delay     atomic.Int64  // time.Duration before each object GET answers
	serial    atomic.Bool   // object GETs one at a time,
	turn      chan struct{} // in the order they arrived (channel waiters queue FIFO)
}

// Start runs a server that accepts only accessKey (any key when empty).
func Start(accessKey, secretKey string) *Server {
	s := newServer(accessKey, secretKey)
	s.srv.Start()
	s.URL = s.srv.URL
	return s
}

// StartOn is Start on a given address (host:port; port 0 picks one), for
// a local S3 a person runs by hand (gd2fs-bench s3).
func StartOn(addr, accessKey, secretKey string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := newServer(accessKey, secretKey)
	s.srv.Listener.Close()
	s.srv.Listener = ln
	s.srv.Start()
	s.URL = s.srv.URL
	return s, nil
}

func newServer(accessKey, secretKey string) *Server {
	s := &Server{AccessKey: accessKey, SecretKey: secretKey, backend: s3mem.New(), turn: make(chan struct{}, 1)}
	s.failAfter.Store(-1)
	fake := gofakes3.New(s.backend, gofakes3.WithAutoBucket(false)).Server()
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if s.down.Load() {
			http.Error(w, "down for the test", http.StatusServiceUnavailable)
			return
		}
		if s.AccessKey != "" && !strings.Contains(r.Header.Get("Authorization"), "Credential="+s.AccessKey+"/") {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message>The access key you provided does not exist.</Message></Error>`)
			return
		}
		if r.Method == http.MethodGet && strings.Count(strings.Trim(r.URL.Path, "/"), "/") >= 1 {
			s.gets.Add(1)
			if s.serial.Load() {
				s.turn <- struct{}{}
				defer func() { <-s.turn }()
			}
			if d := time.Duration(s.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			w = &counting{ResponseWriter: w, s: s}
		}
		fake.ServeHTTP(w, r)
	}))
	return s
}

type counting struct {
	http.ResponseWriter
	s *Server
}

func (c *counting) Write(p []byte) (int, error) {
	if left := c.s.failAfter.Load(); left >= 0 {
		if int64(len(p)) > left {
			c.s.failAfter.Store(-1)
			c.ResponseWriter.Write(p[:left])
			c.s.sent.Add(left)
			panic(http.ErrAbortHandler) // drop the connection mid-body
		}
		c.s.failAfter.Add(-int64(len(p)))
	}
	n, err := c.ResponseWriter.Write(p)
	c.s.sent.Add(int64(n))
	return n, err
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// CreateBucket makes a bucket.
func (s *Server) CreateBucket(name string) error { return s.backend.CreateBucket(name) }

// Put stores an object.
func (s *Server) Put(bucket, key string, data []byte) error {
	meta := map[string]string{"Last-Modified": time.Now().UTC().Format(http.TimeFormat)} // as gofakes3's own PUT records it
	_, err := s.backend.PutObject(bucket, key, meta, bytes.NewReader(data), int64(len(data)), nil)
	return err
}

// BytesSent is the object bytes sent in GET responses so far.
func (s *Server) BytesSent() int64 { return s.sent.Load() }

// GETs is the number of object GETs served so far.
func (s *Server) GETs() int64 { return s.gets.Load() }

// Requests is the number of HTTP requests received, those refused while
// down included (how many attempts a client made).
func (s *Server) Requests() int64 { return s.requests.Load() }

// ResetCounters zeroes the byte and GET counters.
func (s *Server) ResetCounters() { s.sent.Store(0); s.gets.Store(0) }

// FailAfter makes the next object response break after n more bytes.
func (s *Server) FailAfter(n int64) { s.failAfter.Store(n) }

// SetDown makes every request fail with 503 (true) or work again (false).
func (s *Server) SetDown(down bool) { s.down.Store(down) }

// SetDelay makes every object GET wait d before it answers, as a distant S3
// does: a test can then act (kill a process) while transfers are in flight.
func (s *Server) SetDelay(d time.Duration) { s.delay.Store(int64(d)) }

// SetSerial makes object GETs answer one at a time, first come first served
// (with SetDelay: a slow link whose bytes arrive steadily and in order
// rather than all at once).
func (s *Server) SetSerial(on bool) { s.serial.Store(on) }
