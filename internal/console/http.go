package console

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/internal/authlimit"
	"github.com/gd2fs/gd2fs/internal/version"
)

//go:embed templates/*.html static/*
var files embed.FS

var tmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"pct": func(f float64) string { return trimFloat(f * 100) },
}).ParseFS(files, "templates/*.html"))

const cookieName = "gd2fs_console"

// pages are the console's pages, in menu order.
var pages = []struct{ Name, Title string }{
	{"cluster", "Cluster"}, {"kv", "KV cache"}, {"sessions", "Sessions"}, {"models", "Models"},
}

// Handler serves everything under /ui/.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(files, "static")
	files := http.StripPrefix("/ui/static/", http.FileServerFS(static))
	mux.HandleFunc("GET /ui/static/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") { // files only, no listing (issue 22 finding 17)
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /ui/{$}", func(w http.ResponseWriter, r *http.Request) {
		if c.authed(w, r) {
			http.Redirect(w, r, "/ui/cluster", http.StatusFound)
		}
	})
	mux.HandleFunc("GET /ui/login", func(w http.ResponseWriter, r *http.Request) {
		c.login(w, r, http.StatusOK, "")
	})
	mux.HandleFunc("POST /ui/login", c.postLogin)
	mux.HandleFunc("POST /ui/logout", func(w http.ResponseWriter, r *http.Request) {
		if ck, err := r.Cookie(cookieName); err == nil {
			c.logins.end(ck.Value) // the cookie is dead even if the browser keeps it
		}
		http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/ui/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
		http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
	})
	for _, p := range pages {
		mux.HandleFunc("GET /ui/"+p.Name, func(w http.ResponseWriter, r *http.Request) {
			if !c.authed(w, r) {
				return
			}
			v := c.view(r.Context(), p.Name, r.URL.Query())
			var b bytes.Buffer
			if err := tmpl.ExecuteTemplate(&b, "page.html", v); err != nil {
				c.cfg.Log.Error("console: render", "page", p.Name, "err", err)
				http.Error(w, "render failed: "+err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Write(b.Bytes())
		})
		mux.HandleFunc("GET /ui/api/"+p.Name, func(w http.ResponseWriter, r *http.Request) {
			if !c.authed(w, r) {
				return
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(c.view(r.Context(), p.Name, r.URL.Query()))
		})
	}
	return headers(mux)
}

// headers sets what every answer carries: no caching (pages hold live
// figures), no framing, no inline script or style, no referrer (a URL may
// hold the token once).
func headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		if !strings.HasPrefix(r.URL.Path, "/ui/static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// authed checks the cookie, a bearer token, or ?token= (which sets the
// cookie and redirects to the same URL without it). Otherwise it answers
// 401: the login form for pages, JSON for /ui/api/.
func (c *Console) authed(w http.ResponseWriter, r *http.Request) bool {
	if c.cfg.Token == "" {
		return true
	}
	if ck, err := r.Cookie(cookieName); err == nil && c.logins.valid(ck.Value, time.Now()) {
		return true
	}
	if a := r.Header.Get("Authorization"); a != "" && subtle.ConstantTimeCompare([]byte(a), []byte("Bearer "+c.cfg.Token)) == 1 {
		return true
	}
	q := r.URL.Query()
	if t := q.Get("token"); t != "" {
		if !c.tokenGuess(r, t) {
			c.deny(w, r, "wrong token, or too many wrong ones from this address: wait a few seconds")
			return false
		}
		c.setCookie(w, r)
		q.Del("token")
		u := *r.URL
		u.RawQuery = q.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return false
	}
	c.deny(w, r, "")
	return false
}

func (c *Console) deny(w http.ResponseWriter, r *http.Request, msg string) {
	if strings.HasPrefix(r.URL.Path, "/ui/api/") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		json.NewEncoder(w).Encode(map[string]string{"error": "log in to the console, or pass the cluster token as Authorization: Bearer <token>", "code": "unauthorized"})
		return
	}
	r.URL.RawQuery = stripToken(r.URL.Query())
	c.login(w, r, http.StatusUnauthorized, msg)
}

func stripToken(q url.Values) string {
	q.Del("token")
	return q.Encode()
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: c.logins.start(time.Now()), Path: "/ui/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(cookieLife.Seconds())})
}

// login renders the login form; next is where to go after it.
func (c *Console) login(w http.ResponseWriter, r *http.Request, code int, msg string) {
	next := r.URL.RequestURI()
	if r.URL.Path == "/ui/login" {
		next = safeNext(r.URL.Query().Get("next"))
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	tmpl.ExecuteTemplate(w, "login.html", map[string]any{"Next": next, "Error": msg, "NoToken": c.cfg.Token == ""})
}

// safeNext keeps a redirect target inside the console: a path under /ui/
// once its dot segments (escaped ones too) are resolved, no host, no
// scheme; anything else goes to the cluster page (issue 22 finding 13:
// /ui/../../metrics left the console).
func safeNext(s string) string {
	const home = "/ui/cluster"
	if !strings.HasPrefix(s, "/ui/") || strings.HasPrefix(s, "//") || strings.ContainsAny(s, "\\\r\n") {
		return home
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return home
	}
	clean := path.Clean(u.Path)
	if !strings.HasPrefix(clean+"/", "/ui/") || clean == "/ui" {
		return home
	}
	if clean != u.Path && !(strings.HasSuffix(u.Path, "/") && clean+"/" == u.Path) {
		return home // dot segments or doubled slashes: not a link the console makes
	}
	return s
}

func (c *Console) postLogin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	if c.cfg.Token != "" && !c.tokenGuess(r, r.PostForm.Get("token")) {
		r.URL.RawQuery = url.Values{"next": {next}}.Encode()
		c.login(w, r, http.StatusUnauthorized, "wrong token, or too many wrong ones from this address: wait a few seconds")
		return
	}
	if c.cfg.Token != "" {
		c.setCookie(w, r)
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// view builds a page's view; errors become a banner, not a failed page.
func (c *Console) view(ctx context.Context, page string, q url.Values) *View {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v := &View{Page: page, Updated: time.Now().UTC().Format("2006-01-02 15:04:05 UTC"), Version: version.Get().String(), LogOut: c.cfg.Token != ""}
	for _, p := range pages {
		v.Menu = append(v.Menu, MenuItem{Name: p.Name, Title: p.Title, Current: p.Name == page})
		if p.Name == page {
			v.Title = p.Title
		}
	}
	leads, leader := c.src.Leader(ctx)
	if !leads {
		v.Banners = append(v.Banners, Banner{Level: "warn", Text: "This master is a standby: live figures are on the leader, " + leader + "."})
	}
	st, err := c.src.Status(ctx)
	if err != nil {
		v.Banners = append(v.Banners, Banner{Level: "error", Text: "status: " + err.Error()})
	}
	v.Cluster, v.Epoch = st.Cluster, st.Epoch
	switch page {
	case "cluster":
		c.clusterView(ctx, v, st, leads)
	case "kv":
		c.kvView(v, st)
	case "sessions":
		c.sessionsView(ctx, v, q.Get("id"))
	case "models":
		c.modelsView(ctx, v, st)
	}
	return v
}

// tokenGuess checks a token typed in the log-in form or given as ?token=,
// slowed per address after a few wrong ones (authlimit).
func (c *Console) tokenGuess(r *http.Request, t string) bool {
	host := authlimit.Host(r.RemoteAddr)
	if ok, _ := c.guesses.Allow(host); !ok {
		return false
	}
	if subtle.ConstantTimeCompare([]byte(t), []byte(c.cfg.Token)) == 1 {
		return true
	}
	c.guesses.Fail(host)
	return false
}
