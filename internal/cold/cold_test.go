package cold

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/s3test"
)

func TestSource(t *testing.T) {
	s3 := s3test.Start("AKID", "secret")
	defer s3.Close()
	s3.CreateBucket("models")
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	s3.Put("models", "org/m/model.safetensors", data)
	s3.Put("models", "org/m/config.json", []byte("{}"))
	src, err := New(Config{Endpoint: s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	objs, err := src.List(ctx, "models", "org/m/")
	if err != nil || len(objs) != 2 || objs[0].Key != "org/m/config.json" || objs[1].Size != int64(len(data)) {
		t.Fatalf("list %+v %v", objs, err)
	}
	buf := make([]byte, 1000)
	if err := src.ReadRange(ctx, "models", "org/m/model.safetensors", 12345, buf); err != nil || !bytes.Equal(buf, data[12345:13345]) {
		t.Fatalf("range: %v", err)
	}
	// A response cut mid-body is retried.
	s3.FailAfter(300)
	if err := src.ReadRange(ctx, "models", "org/m/model.safetensors", 0, buf); err != nil || !bytes.Equal(buf, data[:1000]) {
		t.Fatalf("retry after a cut: %v", err)
	}
	if _, err := src.List(ctx, "nope", ""); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("missing bucket: %v", err)
	}
	if err := src.ReadRange(ctx, "models", "org/m/none", 0, buf); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	bad, _ := New(Config{Endpoint: s3.URL, AccessKey: "WRONG", SecretKey: "x", Region: "us-east-1"})
	if _, err := bad.List(ctx, "models", ""); !errors.Is(err, errs.ErrUnauthorized) {
		t.Fatalf("wrong credentials: %v", err)
	}
	s3.SetDown(true)
	fast, _ := New(Config{Endpoint: s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1", Retries: 1})
	if err := fast.ReadRange(ctx, "models", "org/m/model.safetensors", 0, buf); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("S3 down: %v", err)
	}
	if _, _, err := ParseURI("http://x"); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatal("bad URI accepted")
	}
}

// TestOneRetryLoop: against an S3 that refuses everything, a read makes
// exactly Retries+1 attempts: minio-go's own retries (10 by default) are off
// under ours (issue 21, bug 3).
func TestOneRetryLoop(t *testing.T) {
	s3 := s3test.Start("AKID", "secret")
	defer s3.Close()
	s3.SetDown(true)
	src, err := New(Config{Endpoint: s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1", Retries: 2})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	if err := src.ReadRange(context.Background(), "models", "m", 0, buf); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("S3 down: %v", err)
	}
	if got := s3.Requests(); got != 3 {
		t.Fatalf("a read against a failing S3 made %d requests, want 3 (Retries 2 + the first)", got)
	}
}
