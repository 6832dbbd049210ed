//! Writes a small page file, reads it back, and prints `inspect`:
//! `cargo run -p cachex-page-alloc --example pages_demo -- <path>`.

use page_alloc::{PageReader, PageWriter, Schema, Value, WriterOptions, inspect, verify};
use tensor_core::DType;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "demo.pages".to_string());
    let schema = Schema::new()
        .int("label")
        .float("weight")
        .bytes("jpeg")
        .array("embedding", DType::F32, [4]);
    let options = WriterOptions::default().page_size(4096).alignment(64);
    let mut writer = PageWriter::create(&path, schema, options)?;
    for i in 0..24u32 {
        let jpeg = vec![i as u8; (i as usize * 397) % 5000];
        let embedding: Vec<u8> = (0..4)
            .flat_map(|k| (i as f32 + k as f32).to_le_bytes())
            .collect();
        writer.append(&[
            Value::Int(i64::from(i % 10)),
            Value::Float(f64::from(i) / 8.0),
            Value::Bytes(&jpeg),
            Value::Bytes(&embedding),
        ])?;
    }
    writer.finalize()?;

    let reader = PageReader::open(&path)?;
    let sample = reader.sample(3)?;
    println!(
        "sample 3: label {}, {} jpeg bytes, embedding {:?}",
        sample.int(0)?,
        sample.bytes(2)?.len(),
        sample.array(3)?.as_slice::<f32>()?
    );
    print!("{}", inspect(&path)?);
    println!("problems: {}", verify(&path).len());
    Ok(())
}
