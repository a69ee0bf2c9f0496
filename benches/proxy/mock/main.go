// Command mock is the upstream scripts/proxy-bench puts behind every gateway it measures:
// an OpenAI-compatible server with no model, whose answers cost next to nothing to make,
// so that what a client sees through a gateway, minus what it sees from the mock alone,
// is the gateway's.
//
//	GET  /v1/models            one model, whatever -model says
//	POST /v1/chat/completions  non-streamed: the whole answer at once, with usage;
//	                           streamed: -deltas content chunks -gap apart, the first at
//	                           once, then a chunk with finish_reason, a usage chunk when
//	                           stream_options.include_usage, and [DONE]
//	GET  /health               200, for routers that probe their workers
//
// Frames are sent on a fixed schedule from the start of the stream (start + k*gap), so a
// late wake-up does not push every later frame back. Go sets TCP_NODELAY on every
// connection, and each frame is flushed on its own; with -gap 0 (the stream a gateway asks
// for behind a non-streamed request) the whole answer goes at once.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

type config struct {
	deltas int
	gap    time.Duration
	model  string
}

// request is the part of a chat request the mock looks at; everything else is ignored.
type request struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	MaxTokens     int    `json:"max_tokens"`
	MaxCompletion int    `json:"max_completion_tokens"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

const promptTokens = 16

var nextID atomic.Uint64

func main() {
	listen := flag.String("listen", "127.0.0.1:8000", "address to listen on")
	deltas := flag.Int("deltas", 64, "content chunks per streamed answer (tokens per answer)")
	gap := flag.Duration("gap", 20*time.Millisecond, "time between two content chunks")
	model := flag.String("model", "mock", "the model id /v1/models lists")
	flag.Parse()
	cfg := config{deltas: *deltas, gap: *gap, model: *model}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", cfg.models)
	mux.HandleFunc("GET /models", cfg.models)
	mux.HandleFunc("POST /v1/chat/completions", cfg.chat)
	mux.HandleFunc("POST /chat/completions", cfg.chat)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("mock: listening on %s, %d deltas %s apart", *listen, cfg.deltas, cfg.gap)
	log.Fatal(srv.ListenAndServe())
}

func (cfg config) models(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","created":0,"owned_by":"mock"}]}`, cfg.model)
}

func (cfg config) chat(w http.ResponseWriter, r *http.Request) {
	var req request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"the body is not JSON","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	n := cfg.deltas
	// A gateway may pass the client's max_tokens on; the mock honours a smaller one.
	for _, limit := range []int{req.MaxTokens, req.MaxCompletion} {
		if limit > 0 && limit < n {
			n = limit
		}
	}
	model := req.Model
	if model == "" {
		model = cfg.model
	}
	id := "chatcmpl-mock-" + strconv.FormatUint(nextID.Add(1), 10)
	created := time.Now().Unix()
	if req.Stream {
		cfg.stream(w, id, created, model, n, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		return
	}
	buf := make([]byte, 0, 256+6*n)
	buf = append(buf, `{"id":"`...)
	buf = append(buf, id...)
	buf = append(buf, `","object":"chat.completion","created":`...)
	buf = strconv.AppendInt(buf, created, 10)
	buf = append(buf, `,"model":`...)
	buf = strconv.AppendQuote(buf, model)
	buf = append(buf, `,"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	for i := 0; i < n; i++ {
		buf = appendToken(buf, i)
	}
	buf = append(buf, `"},"logprobs":null,"finish_reason":"stop"}],`...)
	buf = appendUsage(buf, n)
	buf = append(buf, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
	w.Write(buf)
}

func (cfg config) stream(w http.ResponseWriter, id string, created int64, model string, n int, usage bool) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)

	// Every chunk starts the same way; only its delta, finish_reason and usage differ.
	head := []byte(`data: {"id":"` + id + `","object":"chat.completion.chunk","created":` +
		strconv.FormatInt(created, 10) + `,"model":` + strconv.Quote(model) + `,"choices":[`)
	frame := make([]byte, 0, len(head)+160)
	send := func(build func([]byte) []byte) bool {
		frame = build(append(frame[:0], head...))
		frame = append(frame, "\n\n"...)
		if _, err := w.Write(frame); err != nil {
			return false // the client left
		}
		// With no gap the answer is ready at once, as a fast upstream's would be: it
		// leaves in as few writes as the buffer allows, not one per frame.
		if cfg.gap > 0 {
			flusher.Flush()
		}
		return true
	}

	start := time.Now()
	for i := 0; i < n; i++ {
		if i > 0 {
			if wait := time.Until(start.Add(time.Duration(i) * cfg.gap)); wait > 0 {
				time.Sleep(wait)
			}
		}
		ok := send(func(b []byte) []byte {
			b = append(b, `{"index":0,"delta":{`...)
			if i == 0 {
				b = append(b, `"role":"assistant",`...)
			}
			b = append(b, `"content":"`...)
			b = appendToken(b, i)
			return append(b, `"},"logprobs":null,"finish_reason":null}]}`...)
		})
		if !ok {
			return
		}
	}
	if !send(func(b []byte) []byte {
		return append(b, `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`...)
	}) {
		return
	}
	if usage && !send(func(b []byte) []byte {
		b = append(b, "],"...)
		return append(appendUsage(b, n), '}')
	}) {
		return
	}
	w.Write([]byte("data: [DONE]\n\n"))
	flusher.Flush()
}

// appendToken writes the i-th token of an answer: a short word and a space, so that the
// content is text any gateway's tokenizer or scorer takes as ordinary.
func appendToken(b []byte, i int) []byte {
	b = append(b, "tok"...)
	b = strconv.AppendInt(b, int64(i), 10)
	return append(b, ' ')
}

func appendUsage(b []byte, completion int) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, promptTokens, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"total_tokens":`...)
	return append(strconv.AppendInt(b, int64(promptTokens+completion), 10), '}')
}
