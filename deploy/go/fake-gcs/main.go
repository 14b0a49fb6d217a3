// Command fake-gcs runs fake-gcs-server (github.com/fsouza/fake-gcs-server) over plain HTTP
// with one addition: object uploads through the XML API (`PUT /<bucket>/<object>`), which
// the Rust object_store crate (and so obstore and delta-rs) uses and upstream does not serve
// yet. Such a PUT is handed to the server's own JSON media upload, and its
// `x-goog-if-generation-match` header becomes the `ifGenerationMatch` parameter, so the
// server itself decides put-if-absent (`0`) under its storage lock.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

func main() {
	host := flag.String("host", "127.0.0.1", "address to listen on")
	port := flag.Uint("port", 4443, "port to listen on")
	root := flag.String("root", "", "directory that holds the buckets (filesystem backend); empty keeps them in memory")
	flag.Parse()

	addr := fmt.Sprintf("%s:%d", *host, *port)
	server, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme:      "http",
		Host:        *host,
		Port:        uint16(*port),
		NoListener:  true,
		StorageRoot: *root,
		PublicHost:  addr,
		ExternalURL: "http://" + addr,
		Writer:      os.Stderr,
	})
	if err != nil {
		log.Fatalf("fake-gcs: cannot create the server: %v", err)
	}
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatalf("fake-gcs: cannot listen on %s: %v", addr, err)
	}
	inner := server.HTTPHandler()
	go func() {
		log.Fatal(http.Serve(listener, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if isXMLUpload(r) {
				xmlUpload(inner, w, r)
				return
			}
			inner.ServeHTTP(w, r)
		})))
	}()
	log.Printf("fake-gcs: serving http://%s", addr)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	<-ch
}

// isXMLUpload: a plain PUT of one object, not a signed-URL, resumable or JSON API request.
func isXMLUpload(r *http.Request) bool {
	if r.Method != http.MethodPut {
		return false
	}
	p := r.URL.EscapedPath()
	if strings.HasPrefix(p, "/upload/") || strings.HasPrefix(p, "/storage/") || strings.HasPrefix(p, "/_internal/") {
		return false
	}
	q := r.URL.Query()
	if q.Has("X-Goog-Algorithm") || q.Has("uploadId") || q.Has("upload_id") {
		return false
	}
	return strings.Count(strings.TrimPrefix(p, "/"), "/") >= 1
}

func xmlUpload(inner http.Handler, w http.ResponseWriter, r *http.Request) {
	bucket, escaped, _ := strings.Cut(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	name, err := url.PathUnescape(escaped)
	if err != nil || name == "" {
		http.Error(w, "bad object name", http.StatusBadRequest)
		return
	}
	q := url.Values{"uploadType": {"media"}, "name": {name}}
	if g := r.Header.Get("x-goog-if-generation-match"); g != "" {
		q.Set("ifGenerationMatch", g)
	}
	r2 := r.Clone(r.Context())
	r2.Method = http.MethodPost
	r2.URL = &url.URL{Path: "/upload/storage/v1/b/" + bucket + "/o", RawQuery: q.Encode()}
	r2.RequestURI = ""
	rec := httptest.NewRecorder()
	inner.ServeHTTP(rec, r2)
	if rec.Code != http.StatusOK {
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		return
	}
	var obj struct {
		Etag       string `json:"etag"`
		Md5Hash    string `json:"md5Hash"`
		Generation string `json:"generation"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &obj)
	etag := obj.Etag
	if etag == "" {
		etag = obj.Md5Hash
	}
	w.Header().Set("ETag", `"`+strings.Trim(etag, `"`)+`"`)
	if obj.Generation != "" {
		w.Header().Set("x-goog-generation", obj.Generation)
	}
	w.WriteHeader(http.StatusOK)
}
