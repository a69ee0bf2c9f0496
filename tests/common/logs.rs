//! Log capture: the test binary's global subscriber, with llmgate's JSON line format,
//! writing into a buffer the tests read.

use std::sync::{Arc, Mutex, OnceLock};

/// Log lines written by the global JSON subscriber of this test binary.
pub fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buffer);
        let writer = move || SharedWriter(Arc::clone(&sink));
        tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("llmgate=debug"))
            .with(llmgate::telemetry::logs::json_layer(writer))
            .try_init()
            .expect("the only subscriber of this test binary");
        buffer
    })
    .clone()
}

struct SharedWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
