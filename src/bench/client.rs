//! One measured request: streamed over HTTP to any OpenAI-compatible server, or handed
//! straight to the engine in-process. Both use the gateway's own definitions (TTFT to
//! the first non-empty content, TPOT over the tokens after the first, ITL between
//! content chunks, e2e to the end of the stream).

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use crate::engine::{
    Budget, ChatMessage, EngineEvent, Front, GenerationRequest, Prompt, Role, Sampling,
};

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
    pub itl: Vec<Duration>,
    pub e2e: Duration,
    pub output_tokens: u32,
    /// The gateway's own figures, when the server is llmgate (the `timings` object).
    pub server_ttft_ms: Option<f64>,
    pub server_tpot_ms: Option<f64>,
    pub error: Option<String>,
    /// The first send failed before reaching the server and was sent again.
    pub resent: bool,
}

/// The request body's sampling settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub max_tokens: u32,
    pub temperature: f64,
}

fn tpot(first: Option<Instant>, last: Option<Instant>, tokens: u32) -> Option<Duration> {
    match (first, last) {
        (Some(first), Some(last)) if tokens >= 2 => Some((last - first) / (tokens - 1)),
        _ => None,
    }
}

/// Streams one chat completion from `url` and times it as it arrives.
pub async fn over_http(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    messages: &Value,
    settings: Settings,
) -> Sample {
    let body = serde_json::json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
    });
    let started = Instant::now();
    let mut sample = Sample::default();
    let send = || {
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send()
    };
    let mut sent = send().await;
    // A kept-alive connection the server closed just as it was taken from the pool
    // (llama-server closes them after a few requests): the request never reached the
    // server. Sent again once, as the SDKs do, timed from the first try.
    if matches!(&sent, Err(error) if error.is_request() && !error.is_timeout()) {
        sample.resent = true;
        sent = send().await;
    }
    let response = match sent {
        Ok(response) if response.status().is_success() => response,
        Ok(response) => {
            sample.error = Some(format!("status {}", response.status()));
            sample.e2e = started.elapsed();
            return sample;
        }
        Err(error) => {
            sample.error = Some(error.to_string());
            sample.e2e = started.elapsed();
            return sample;
        }
    };
    let mut stream = Streamed::default();
    let mut buffer = Vec::new();
    let mut bytes = response.bytes_stream();
    'read: while let Some(read) = bytes.next().await {
        let read = match read {
            Ok(read) => read,
            Err(error) => {
                sample.error = Some(error.to_string());
                break;
            }
        };
        let now = Instant::now();
        buffer.extend_from_slice(&read);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = buffer.drain(..end + 2).collect();
            if stream.frame(&frame, now, &mut sample) {
                break 'read;
            }
        }
    }
    sample.e2e = started.elapsed();
    stream.measured(started, &mut sample);
    sample
}

/// What a streamed answer has shown so far, as its frames arrive.
#[derive(Debug, Default)]
struct Streamed {
    /// When content first and last arrived.
    first: Option<Instant>,
    last: Option<Instant>,
    /// Chunks with content (the count, where the server sends no usage).
    chunks: u32,
    /// The server's count of the answer's tokens.
    usage_tokens: Option<u32>,
    /// A finish_reason came; `[DONE]` came.
    finished: bool,
    done: bool,
}

impl Streamed {
    /// One SSE frame, arrived at `now`: its content timed, its figures taken into
    /// `sample`. Whether it was `[DONE]`.
    fn frame(&mut self, frame: &[u8], now: Instant, sample: &mut Sample) -> bool {
        let Some(data) = std::str::from_utf8(frame)
            .ok()
            .and_then(|f| f.trim().strip_prefix("data: "))
        else {
            return false;
        };
        if data == "[DONE]" {
            self.done = true;
            return true;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return false;
        };
        if chunk.get("error").is_some() {
            sample.error = Some(chunk["error"]["message"].to_string());
        }
        let content = chunk["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap_or("");
        if !content.is_empty() {
            if let Some(previous) = self.last {
                sample.itl.push(now - previous);
            }
            self.first.get_or_insert(now);
            self.last = Some(now);
            self.chunks += 1;
        }
        if chunk["choices"][0]["finish_reason"].is_string() {
            self.finished = true;
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            self.usage_tokens = u32::try_from(n).ok();
        }
        if let Some(t) = chunk.get("timings") {
            sample.server_ttft_ms = t["ttft_ms"].as_f64();
            sample.server_tpot_ms = t["tpot_ms"].as_f64();
        }
        false
    }

    /// The sample's figures from the whole stream, for a request sent at `started`.
    fn measured(self, started: Instant, sample: &mut Sample) {
        sample.output_tokens = self.usage_tokens.unwrap_or(self.chunks);
        sample.ttft = self.first.map(|f| f - started);
        sample.tpot = tpot(self.first, self.last, sample.output_tokens);
        // A stream cut short is a failure even when the status was 200 (some servers
        // abort concurrent streams that way: a role chunk, then [DONE]).
        if sample.error.is_none() && !(self.finished && self.done) {
            sample.error = Some(
                if self.done {
                    "the stream ended without a finish_reason"
                } else {
                    "the stream ended without [DONE]"
                }
                .into(),
            );
        }
    }
}

/// Runs one request straight through `engine`: no HTTP, no chunk assembly.
pub async fn in_process(engine: &Front, messages: &Value, settings: Settings) -> Sample {
    let messages = messages
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| {
                    let role = match m["role"].as_str() {
                        Some("system") => Role::System,
                        Some("assistant") => Role::Assistant,
                        _ => Role::User,
                    };
                    ChatMessage::new(role, m["content"].as_str().unwrap_or(""))
                })
                .collect()
        })
        .unwrap_or_default();
    let request = GenerationRequest {
        request_id: uuid::Uuid::new_v4().simple().to_string(),
        prompt: Prompt::Chat(messages),
        budget: Budget::Asked(settings.max_tokens),
        sampling: Sampling {
            temperature: Some(settings.temperature),
            ..Sampling::default()
        },
        ..GenerationRequest::default()
    };
    let started = Instant::now();
    let mut sample = Sample::default();
    let mut generation = match engine.run(request).await {
        Ok(generation) => generation,
        Err(error) => {
            sample.error = Some(error.to_string());
            sample.e2e = started.elapsed();
            return sample;
        }
    };
    let (mut first, mut last, mut last_token) = (None::<Instant>, None::<Instant>, None);
    let mut tokens = 0u32;
    while let Some(event) = generation.events.recv().await {
        let now = Instant::now();
        match event {
            EngineEvent::Token { text, .. } => {
                tokens += 1;
                last_token = Some(now);
                if !text.is_empty() {
                    if let Some(previous) = last {
                        sample.itl.push(now - previous);
                    }
                    first.get_or_insert(now);
                    last = Some(now);
                }
            }
            EngineEvent::Finished { usage, .. } => {
                tokens = usage.completion_tokens;
                break;
            }
            EngineEvent::Failed(error) => {
                sample.error = Some(error.to_string());
                break;
            }
            EngineEvent::Restarted => {
                (first, last, last_token, tokens) = (None, None, None, 0);
                sample.itl.clear();
            }
            // The engine in this process gives neither; output all the same.
            EngineEvent::Reasoning { tokens: n, .. } | EngineEvent::ToolCall { tokens: n, .. } => {
                tokens += n;
                last_token = Some(now);
                first.get_or_insert(now);
                last = Some(now);
            }
            EngineEvent::Progress { .. } => {}
        }
    }
    sample.e2e = started.elapsed();
    sample.output_tokens = tokens;
    sample.ttft = first.map(|f| f - started);
    sample.tpot = tpot(first, last.max(last_token), tokens);
    sample
}
