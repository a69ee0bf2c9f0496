module llmgate/benches/proxy

go 1.26
