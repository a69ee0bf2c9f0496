package main

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Each data line of a stream is a chunk that decodes as JSON, the content deltas are as
// many as asked, then one finish_reason, the usage chunk when asked for, and [DONE].
func TestStreamShape(t *testing.T) {
	cfg := config{deltas: 64, gap: time.Millisecond, model: "mock"}
	for _, usage := range []bool{false, true} {
		body := `{"model":"m","stream":true,"max_tokens":5}`
		if usage {
			body = `{"model":"m","stream":true,"max_tokens":5,"stream_options":{"include_usage":true}}`
		}
		w := httptest.NewRecorder()
		cfg.chat(w, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body)))
		var content, finish, usages int
		var done bool
		for _, line := range strings.Split(w.Body.String(), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				done = true
				continue
			}
			var c struct {
				Object  string
				Model   string
				Choices []struct {
					Delta        struct{ Content string }
					FinishReason *string `json:"finish_reason"`
				}
				Usage *struct {
					CompletionTokens int `json:"completion_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(data), &c); err != nil {
				t.Fatalf("frame %q: %v", data, err)
			}
			if c.Object != "chat.completion.chunk" || c.Model != "m" {
				t.Errorf("frame %q", data)
			}
			for _, ch := range c.Choices {
				if ch.Delta.Content != "" {
					content++
				}
				if ch.FinishReason != nil {
					finish++
				}
			}
			if c.Usage != nil {
				usages++
				if c.Usage.CompletionTokens != 5 {
					t.Errorf("usage %+v", c.Usage)
				}
			}
		}
		want := map[bool]int{false: 0, true: 1}[usage]
		if content != 5 || finish != 1 || usages != want || !done {
			t.Errorf("usage %v: %d deltas, %d finish, %d usage chunks, done %v", usage, content, finish, usages, done)
		}
	}
}

func TestNonStreamedAnswer(t *testing.T) {
	cfg := config{deltas: 3, gap: time.Second, model: "mock"}
	w := httptest.NewRecorder()
	start := time.Now()
	cfg.chat(w, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"m"}`)))
	if time.Since(start) > 100*time.Millisecond {
		t.Error("a non-streamed answer waited for the gap")
	}
	var a struct {
		Choices []struct {
			Message      struct{ Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
		t.Fatal(err)
	}
	if len(a.Choices) != 1 || a.Choices[0].Message.Content != "tok0 tok1 tok2 " ||
		a.Choices[0].FinishReason != "stop" || a.Usage.CompletionTokens != 3 {
		t.Errorf("answer %s", w.Body.String())
	}
}
