package resp

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/server"
)

// AttachConfig is what a data server needs to serve RESP beside its binary port.
type AttachConfig struct {
	Listen   string // e.g. ":6380"
	Master   string // master URL(s), for keys owned by other servers
	Token    string
	Pool     string      // default "perf"
	MaxValue int64       // the server's --kv-max-value
	TLS      *tls.Config // what the forwarding client dials the master and servers with
	// ServerTLS, when set, serves the RESP port over TLS (Config.TLS).
	ServerTLS *tls.Config
	Log       *slog.Logger
}

// Attach starts a RESP front end for data server srv: keys srv owns are
// served from its tiers, the others forwarded to their owners. Call Serve
// on the result; Close it before srv.
func Attach(srv *server.Server, cfg AttachConfig) (*Server, error) {
	cl, err := client.New(client.Config{Master: cfg.Master, Token: cfg.Token, Timeout: 15 * time.Second, Streams: 2, TLS: cfg.TLS})
	if err != nil {
		return nil, err
	}
	mem := func() MemoryInfo {
		if srv.KV() == nil {
			return MemoryInfo{}
		}
		st := srv.KV().Stats()
		return MemoryInfo{Used: st.MemUsed, Cap: st.MemCap, DiskUsed: st.DiskUsed, DiskCap: st.DiskCap}
	}
	s, err := New(Config{Listen: cfg.Listen, Backend: &Cluster{Client: cl, Pool: cfg.Pool, Local: srv}, Token: cfg.Token,
		MaxValue: cfg.MaxValue, Role: "server " + srv.ID(), Memory: mem, TLS: cfg.ServerTLS, Log: cfg.Log})
	if err != nil {
		cl.Close()
		return nil, err
	}
	s.onClose = func() { cl.Close() }
	return s, nil
}

// Gateway starts a stateless RESP front end for a cluster: every key is
// forwarded to its owner. serverTLS, when set, serves the port over TLS.
func Gateway(listen, master, token, pool string, maxValue int64, clientTLS, serverTLS *tls.Config, log *slog.Logger) (*Server, error) {
	cl, err := client.New(client.Config{Master: master, Token: token, Timeout: 15 * time.Second, TLS: clientTLS})
	if err != nil {
		return nil, err
	}
	s, err := New(Config{Listen: listen, Backend: &Cluster{Client: cl, Pool: pool}, Token: token, MaxValue: maxValue, Role: "gateway", TLS: serverTLS, Log: log})
	if err != nil {
		cl.Close()
		return nil, err
	}
	s.onClose = func() { cl.Close() }
	return s, nil
}
