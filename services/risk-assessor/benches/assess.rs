//! In-process assessment of a ~2 KB snippet per language (the target: p50 < 100 µs).
//! `cargo bench -p sandmesh-risk-assessor --bench assess`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use messages::risk::{AssessRequest, ContentType};

/// Ordinary code with a few findings, repeated to about 2 KB.
fn snippet(unit: &str) -> String {
    let mut s = String::new();
    while s.len() < 2048 {
        s.push_str(unit);
    }
    s
}

fn bench(c: &mut Criterion) {
    let python = snippet(
        "import json\n\ndef load(path, default=None):\n    with open(path) as f:\n        \
         data = json.load(f)\n    return {k: v * 2 for k, v in data.items() if v} or default\n\n",
    );
    let javascript = snippet(
        "const fs = require('fs');\nfunction total(items) {\n  return items\n    \
         .filter((x) => x.price > 0)\n    .reduce((sum, x) => sum + x.price * x.qty, 0);\n}\n\
         console.log(`total: ${total([{ price: 2, qty: 3 }])}`);\n",
    );
    let shell = snippet(
        "for f in src/*.rs; do\n  grep -n 'TODO' \"$f\" | head -5\n  wc -l \"$f\"\ndone\n\
         ls -la target | tail -3 && du -sh target\n",
    );
    let browser = serde_json::json!({"selector": "#search", "text": "rust tree-sitter"});
    let cases = [
        ("python_2k", ContentType::Python, python, None),
        ("javascript_2k", ContentType::Javascript, javascript, None),
        ("shell_2k", ContentType::Shell, shell, None),
        (
            "browser_fill",
            ContentType::Browser,
            "fill".to_string(),
            Some(browser),
        ),
    ];
    for (name, content_type, content, params) in cases {
        let request = AssessRequest {
            content,
            content_type,
            params,
            mode: None,
            files: Vec::new(),
        };
        // Warm the per-thread parser and the default policy outside the measurement.
        risk_assessor::assess(&request).expect("assessable");
        c.bench_function(name, |b| {
            b.iter(|| risk_assessor::assess(black_box(&request)).expect("assessable"))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
