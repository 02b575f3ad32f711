//! Container images (issue 49): what a submit with `--image` asks for, and
//! what is refused before the log.

use crate::dev_proc::Dev;

/// A malformed reference, mount or working directory is refused naming the
/// flag; a well-formed one is recorded with its mounts and working
/// directory, and runs only on nodes whose agent runs images
/// (`muster.images`): none here yet, so it is refused as unsatisfiable
/// unless asked to queue.
#[test]
fn t220_an_image_spec_is_checked_recorded_and_placed_only_where_images_run() {
    let dev = Dev::start();
    for (args, needle) in [
        (vec!["--image", "Bad//ref"], "--image \"Bad//ref\": repository component \"Bad\""),
        (vec!["--image", "bb@sha256:abc"], "64 lowercase hex digits"),
        (vec!["--image", "bb", "--mount", "/data:rel"], "--mount target \"rel\": an absolute path"),
        (vec!["--image", "bb", "--mount", "/a:/b/../c"], "no empty, '.' or '..' components"),
        (vec!["--image", "bb", "--workdir", "work"], "--workdir \"work\": an absolute path"),
        (vec!["--mount", "/a:/b"], "required arguments were not provided"),
    ] {
        let mut all = vec!["submit"];
        all.extend(args);
        all.extend(["--", "true"]);
        let e = dev.json(&all);
        let msg = e["error"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{all:?}: {e}");
    }
    let image = "127.0.0.1:5000/test/busybox:1";
    let args = ["submit", "--image", image, "--mount", "/tmp:/data:ro", "--workdir", "/work", "--", "true"];
    let refused = dev.json(&args);
    let msg = refused["error"].as_str().unwrap_or_default();
    assert!(msg.contains("muster.images"), "no node runs images yet: {refused}");
    let mut queued = args.to_vec();
    queued.insert(1, "--queue-if-unsatisfiable");
    let id = dev.ok(&queued)["id"].as_u64().unwrap().to_string();
    let a = dev.ok(&["alloc", "get", &id]);
    assert_eq!(a["image"], image);
    assert_eq!(a["mounts"], serde_json::json!(["/tmp:/data:ro"]));
    assert_eq!(a["workdir"], "/work");
    assert!(a["constraints"].to_string().contains("muster.images"), "{a}");
    // Without an image, the image's entrypoint cannot stand in for a command.
    let e = dev.json(&["submit", "--mount", "/a:/b"]);
    assert!(e["error"].as_str().unwrap_or_default().contains("--image"), "{e}");
}
