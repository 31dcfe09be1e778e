//! The service over a real nats-server: JSON and MessagePack, bad input answered with clear
//! 400/413 errors, hostile nesting that finishes, and the instance heartbeat.

use messages::codec::{self, Encoding};
use messages::risk::{AssessRequest, ContentType, RiskAssessment, RiskLevel};
use messages::ErrorBody;
use sandmesh_client::{decode_reply, ClientError};

fn request(content: &str, content_type: ContentType) -> AssessRequest {
    AssessRequest {
        content: content.into(),
        content_type,
        params: None,
        mode: None,
        files: Vec::new(),
    }
}

fn decode(subject: &str, reply: &async_nats::Message) -> Result<RiskAssessment, ErrorBody> {
    decode_reply::<RiskAssessment>(subject, reply.headers.as_ref(), &reply.payload).map_err(|e| {
        match e {
            ClientError::Service { body, .. } => body,
            other => panic!("not a service reply: {other}"),
        }
    })
}

#[tokio::test]
async fn answers_in_the_callers_encoding() {
    let mut svc = crate::common::start(&[]).await;
    for encoding in [Encoding::Json, Encoding::MsgPack] {
        let body = encoding
            .encode(&request("rm -rf /", ContentType::Shell))
            .unwrap();
        let reply = svc.raw(Some(encoding.content_type()), body).await.unwrap();
        let ct = reply
            .headers
            .as_ref()
            .and_then(|h| h.get(codec::CONTENT_TYPE));
        assert_eq!(ct.map(|v| v.as_str()), Some(encoding.content_type()));
        let a = decode(&svc.subject, &reply).unwrap();
        assert_eq!(a.level, RiskLevel::Critical);
        assert_eq!(a.suggested_tier, messages::exec::Tier::Reject);
    }
    svc.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_error() {
    // The default ceiling (256 KiB), so the 413 below is what a caller of a stock service sees.
    let mut svc = crate::common::start(&[]).await;
    // Invalid UTF-8 inside a MessagePack string, and as raw JSON bytes.
    let mut msgpack =
        rmp_serde::to_vec_named(&request("PLACEHOLDER", ContentType::Python)).unwrap();
    let at = msgpack
        .windows(11)
        .position(|w| w == b"PLACEHOLDER")
        .unwrap();
    msgpack[at..at + 2].copy_from_slice(&[0xff, 0xfe]);
    let json = b"{\"content\":\"\xff\xfe\",\"content_type\":\"python\"}".to_vec();
    let unknown = Encoding::Json
        .encode(&serde_json::json!({"content": "x", "content_type": "cobol"}))
        .unwrap();
    let too_big = Encoding::Json
        .encode(&request(&"x".repeat(256 * 1024 + 1), ContentType::Python))
        .unwrap();
    let bad_mode = Encoding::Json
        .encode(&serde_json::json!({"content": "x", "content_type": "python", "mode": "lax"}))
        .unwrap();
    let cases = [
        (codec::MSGPACK, msgpack, 400, "not valid UTF-8"),
        (codec::JSON, json, 400, "JSON"),
        (
            codec::JSON,
            unknown,
            400,
            "supported: python, javascript, shell, browser",
        ),
        (codec::JSON, too_big, 413, "at most 262144"),
        (codec::JSON, bad_mode, 400, "strict, permissive"),
        (codec::JSON, b"{".to_vec(), 400, "JSON"),
    ];
    for (content_type, body, code, says) in cases {
        let reply = svc.raw(Some(content_type), body).await.unwrap();
        let error = decode(&svc.subject, &reply).unwrap_err();
        assert_eq!(error.code, code, "{error:?}");
        assert!(
            error.message.contains(says),
            "{:?} lacks {says:?}",
            error.message
        );
        let header = reply
            .headers
            .as_ref()
            .unwrap()
            .get(codec::SERVICE_ERROR_CODE);
        assert_eq!(
            header.map(|v| v.as_str().to_string()),
            Some(code.to_string())
        );
    }
    svc.stop().await;
}

#[tokio::test]
async fn deeply_nested_input_finishes_and_the_service_stays_up() {
    let mut svc = crate::common::start(&[]).await;
    let cases = [
        (
            ContentType::Python,
            "(".repeat(100_000) + &")".repeat(100_000),
        ),
        (
            ContentType::Javascript,
            "[".repeat(100_000) + &"]".repeat(100_000),
        ),
        (
            ContentType::Shell,
            "$(".repeat(60_000) + &")".repeat(60_000),
        ),
        (
            ContentType::Python,
            "x = ".to_string() + &"'a' + ".repeat(40_000) + "'a'",
        ),
        (ContentType::Shell, "f() { ".repeat(40_000)),
    ];
    for (content_type, content) in cases {
        let body = Encoding::MsgPack
            .encode(&request(&content, content_type))
            .unwrap();
        let reply = svc.raw(Some(codec::MSGPACK), body).await.unwrap();
        // Only that it returns: any verdict is acceptable, a crash or a hang is not.
        let a = decode(&svc.subject, &reply).unwrap();
        assert!(!a.reason.is_empty());
    }
    let body = Encoding::Json
        .encode(&request("print(1)", ContentType::Python))
        .unwrap();
    let reply = svc.raw(Some(codec::JSON), body).await.unwrap();
    assert_eq!(decode(&svc.subject, &reply).unwrap().level, RiskLevel::Safe);
    svc.stop().await;
}

#[tokio::test]
async fn the_instance_beats_into_the_nodes_bucket() {
    let mut svc = crate::common::start(&[]).await;
    let js = async_nats::jetstream::new(svc.client.clone());
    let kv = js
        .get_key_value(messages::Subjects::default().nodes_bucket())
        .await
        .unwrap();
    let key = messages::heartbeat::heartbeat_key(risk_assessor::SERVICE_NAME, &svc.instance_id);
    let entry = kv.get(&key).await.unwrap().expect("heartbeat key present");
    let beat: messages::heartbeat::Heartbeat = serde_json::from_slice(&entry).unwrap();
    assert_eq!(beat.service, risk_assessor::SERVICE_NAME);
    svc.stop().await;
    // A clean stop removes the key at once.
    assert!(kv.get(&key).await.unwrap().is_none());
}

#[tokio::test]
async fn the_content_ceiling_is_configurable() {
    let mut svc = crate::common::start(&[("SANDMESH_RISK_MAX_CONTENT_BYTES", "1024")]).await;
    for (size, code) in [(1024, None), (1025, Some(413))] {
        let body = Encoding::Json
            .encode(&request(&"#".repeat(size), ContentType::Python))
            .unwrap();
        let reply = svc.raw(Some(codec::JSON), body).await.unwrap();
        let outcome = decode(&svc.subject, &reply);
        assert_eq!(outcome.err().map(|e| e.code), code, "{size} bytes");
    }
    svc.stop().await;
}

/// What an attacker sends: harmless code that imports a file sent with it, the file doing the
/// harm. Over the wire the file is assessed like the code; without it the code is safe (the
/// control: the file, not the code, raises the verdict).
#[tokio::test]
async fn a_requests_files_are_assessed_like_its_code() {
    use messages::exec::{ContentEncoding, FileSpec};
    let mut svc = crate::common::start(&[]).await;
    let code = request("import x\nx.main()", ContentType::Python);
    let with_files = AssessRequest {
        files: vec![
            FileSpec {
                path: "code/x.py".into(),
                content: "import pty\ndef main():\n    pty.os.system('id')\n".into(),
                encoding: ContentEncoding::Utf8,
            },
            FileSpec {
                path: "bin/tool".into(),
                // The first bytes of a native program.
                content: "f0VMRgIBAQA=".into(),
                encoding: ContentEncoding::Base64,
            },
        ],
        ..code.clone()
    };
    for encoding in [Encoding::Json, Encoding::MsgPack] {
        let ask = |req: &AssessRequest| encoding.encode(req).unwrap();
        let reply = svc
            .raw(Some(encoding.content_type()), ask(&code))
            .await
            .unwrap();
        let alone = decode(&svc.subject, &reply).unwrap();
        assert_eq!(alone.level, RiskLevel::Safe, "{alone:?}");
        let reply = svc
            .raw(Some(encoding.content_type()), ask(&with_files))
            .await
            .unwrap();
        let a = decode(&svc.subject, &reply).unwrap();
        assert_eq!(a.level, RiskLevel::Critical, "{a:?}");
        assert!(a.requires_confirmation);
        let in_file = |rule: &str| {
            a.findings
                .iter()
                .find(|f| f.rule == rule)
                .and_then(|f| f.path.clone())
        };
        assert_eq!(in_file("py.os_system").as_deref(), Some("code/x.py"));
        assert_eq!(in_file("file.opaque").as_deref(), Some("bin/tool"));
        assert!(a.reason.contains("code/x.py"), "{}", a.reason);
    }
    svc.stop().await;
}
