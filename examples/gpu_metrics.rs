//! Device check for the NVML gauge: prints the `llmgate_gpu_memory_used_bytes` series as
//! `/metrics` encodes them, and exits with status 1 when NVML reports no GPU.
//!
//! `cargo build --example gpu_metrics --features gpu-metrics`, then run it on a machine
//! with an NVIDIA GPU (and compare with `nvidia-smi --query-gpu=memory.used`).

use std::process::ExitCode;
use std::sync::Arc;

use llmgate::record::CollectingObserver;
use llmgate::telemetry::metrics::{ExpositionFormat, Snapshot};
use llmgate::telemetry::{gpu, Telemetry};

fn main() -> ExitCode {
    let telemetry = Telemetry::without_traces("probe", Arc::new(CollectingObserver::default()));
    telemetry.metrics.refresh(&Snapshot {
        gpu_memory: gpu::memory(),
        ..Snapshot::default()
    });
    let text = match telemetry.metrics.encode(ExpositionFormat::Prometheus) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("could not encode the metrics: {error}");
            return ExitCode::from(2);
        }
    };
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("llmgate_gpu_memory_used_bytes{"))
        .collect();
    for line in &series {
        println!("{line}");
    }
    if series.is_empty() {
        eprintln!("no GPU memory series: NVML found no GPU");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
