package api

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

func TestParseURI(t *testing.T) {
	good := map[string]URI{
		"gd2fs://local/models/m":                                  {Cluster: "local", Path: "/models/m"},
		"gd2fs://10.0.0.1:7070/kv/s/kv-3?cluster=prod":            {Masters: []string{"10.0.0.1:7070"}, Cluster: "prod", Path: "/kv/s/kv-3"},
		"gd2fs://m1:7070,m2:7070/kv-sessions/a/kv-1?cluster=c-01": {Masters: []string{"m1:7070", "m2:7070"}, Cluster: "c-01", Path: "/kv-sessions/a/kv-1"},
		"gd2fs://[::1]:7070/x":                                    {Masters: []string{"[::1]:7070"}, Path: "/x"},
		"gd2fs://local/x?cluster=local":                           {Cluster: "local", Path: "/x"},
	}
	for s, want := range good {
		got, err := ParseURI(s)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v %v, want %+v", s, got, err, want)
		}
	}
	for _, s := range []string{
		"s3://b/k", "gd2fs://", "gd2fs:///x", "gd2fs://local", "gd2fs://h:notaport/x", "gd2fs://h:0/x", "gd2fs://:7070/x",
		"gd2fs://h:1,/x", "gd2fs://h:1/x?cluster=a&cluster=b", "gd2fs://h:1/x?pool=ha", "gd2fs://a/x?cluster=b",
		"gd2fs://h:1/x#frag", "gd2fs://h:1/x?%zz",
	} {
		if _, err := ParseURI(s); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("%s: accepted or wrong error: %v", s, err)
		}
	}
}

func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"gd2fs://local/x", "gd2fs://h:1,h:2/p?cluster=c", "gd2fs://[::1]:1/x?cluster=%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			return
		}
		if len(u.Path) == 0 || u.Path[0] != '/' || (len(u.Masters) == 0 && u.Cluster == "") {
			t.Fatalf("%q parsed to %+v", s, u)
		}
	})
}
