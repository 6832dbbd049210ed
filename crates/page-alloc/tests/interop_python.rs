//! FFCV interop: the fixtures written by the real FFCV 1.0.2 read back as
//! `expected.json` says, a `.beton` written here from the same values is
//! byte-identical to FFCV's, and numpy structured dtypes that follow FFCV's
//! layout read a `.beton` we write field by field.

use page_alloc::beton::{self, BetonField, BetonType, BetonValue};
use serde_json::Value as Json;
use tensor_core::{DType, TensorView};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn ffcv_fixtures_read_back_as_expected() {
    let expected = test_support::expected();
    let ffcv = &expected["ffcv"];
    let files = ffcv["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    for name in files {
        let path = test_support::fixtures_dir()
            .join("ffcv")
            .join(name.as_str().unwrap());
        let file = beton::read(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let len = bytes.len() as u64;
        assert!(beton::is_beton_header(&bytes, len), "{path:?}");
        assert!(!beton::is_beton_header(
            &bytes[..beton::HEADER_LEN - 1],
            len
        ));
        assert!(
            !beton::is_beton_header(&bytes, len - 1),
            "a table of partial rows"
        );
        assert!(beton::verify(&path).is_empty());
        assert_eq!(file.file_len(), len);
        let summary = file.summary();
        assert_eq!(summary.get("num_samples"), Some(&serde_json::json!(40)));
        assert_eq!(summary.tables[0].rows.len(), 5);
        assert_eq!(file.page_size(), ffcv["page_size"].as_u64().unwrap());
        assert_eq!(file.len() as u64, ffcv["num_samples"].as_u64().unwrap());
        let types: Vec<(String, BetonType)> = file
            .fields()
            .iter()
            .map(|f| (f.name.clone(), f.ty.clone()))
            .collect();
        assert_eq!(
            types,
            vec![
                ("id".to_string(), BetonType::Int),
                ("score".to_string(), BetonType::Float),
                ("blob".to_string(), BetonType::Bytes),
                (
                    "arr".to_string(),
                    BetonType::NDArray {
                        dtype: DType::F32,
                        shape: [3, 4].into()
                    }
                ),
                ("meta".to_string(), BetonType::Json),
            ]
        );
        for s in ffcv["samples"].as_array().unwrap() {
            let i = s["index"].as_u64().unwrap() as usize;
            let v = file.sample(i).unwrap();
            assert_eq!(
                v[0],
                BetonValue::Int(s["id"].as_i64().unwrap()),
                "sample {i}"
            );
            assert_eq!(
                v[1],
                BetonValue::Float(s["score"].as_f64().unwrap()),
                "sample {i}"
            );
            let BetonValue::Bytes(blob) = v[2] else {
                panic!("blob")
            };
            assert_eq!(hex(blob), s["blob_hex"].as_str().unwrap(), "sample {i}");
            let BetonValue::NDArray(arr) = &v[3] else {
                panic!("arr")
            };
            assert_eq!(arr.dtype().name(), s["arr"]["dtype"].as_str().unwrap());
            let shape: Vec<usize> = s["arr"]["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(arr.shape().dims(), &shape[..]);
            let want: Vec<f64> = s["arr"]["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(arr.to_f64_vec().unwrap(), want, "sample {i}");
            let BetonValue::Json(text) = v[4] else {
                panic!("meta")
            };
            let meta: Json = serde_json::from_str(text).unwrap();
            assert_eq!(meta, s["meta"], "sample {i}");
        }
    }
}

/// The fixture's samples as values, JSON text formatted as Python's
/// `json.dumps` does with the keys in FFCV's writing order.
fn fixture_values(expected: &Json) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<String>) {
    let samples = expected["ffcv"]["samples"].as_array().unwrap();
    let blobs = samples
        .iter()
        .map(|s| unhex(s["blob_hex"].as_str().unwrap()))
        .collect();
    let arrs = samples
        .iter()
        .map(|s| {
            s["arr"]["data"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|x| (x.as_f64().unwrap() as f32).to_le_bytes())
                .collect()
        })
        .collect();
    let metas = samples
        .iter()
        .map(|s| {
            let m = &s["meta"];
            format!(
                "{{\"id\": {}, \"name\": {}, \"even\": {}}}",
                m["id"], m["name"], m["even"]
            )
        })
        .collect();
    (blobs, arrs, metas)
}

#[test]
fn beton_written_here_is_byte_identical_to_ffcv() {
    let expected = test_support::expected();
    let (blobs, arrs, metas) = fixture_values(&expected);
    let fields = vec![
        BetonField::new("id", BetonType::Int),
        BetonField::new("score", BetonType::Float),
        BetonField::new("blob", BetonType::Bytes),
        BetonField::new(
            "arr",
            BetonType::NDArray {
                dtype: DType::F32,
                shape: [3, 4].into(),
            },
        ),
        BetonField::new("meta", BetonType::Json),
    ];
    let samples: Vec<Vec<BetonValue>> = expected["ffcv"]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            vec![
                BetonValue::Int(s["id"].as_i64().unwrap()),
                BetonValue::Float(s["score"].as_f64().unwrap()),
                BetonValue::Bytes(&blobs[i]),
                BetonValue::NDArray(TensorView::new(DType::F32, [3, 4], &arrs[i]).unwrap()),
                BetonValue::Json(&metas[i]),
            ]
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ours.beton");
    beton::write_with_page_size(&path, &fields, &samples, 2 << 20).unwrap();
    let ours = std::fs::read(&path).unwrap();
    let theirs = std::fs::read(test_support::fixtures_dir().join("ffcv/small_w1.beton")).unwrap();
    assert_eq!(ours.len(), theirs.len());
    let first_diff = ours.iter().zip(&theirs).position(|(a, b)| a != b);
    assert_eq!(first_diff, None, "first differing byte");
    // And python_json formats like json.dumps (here: sorted keys).
    assert_eq!(
        beton::python_json(&serde_json::json!({"b": [1, 2.5, "é"], "a": null})),
        r#"{"a": null, "b": [1, 2.5, "\u00e9"]}"#
    );
}

const NUMPY_READER: &str = r#"
import json, sys
import numpy as np

b = np.fromfile(sys.argv[1], dtype='u1')
H = np.dtype([('version', '<u2'), ('num_fields', '<u2'), ('page_size', '<u4'),
              ('num_samples', '<u8'), ('alloc_table_ptr', '<u8')], align=True)
D = np.dtype([('type_id', '<u1'), ('name', ('<u1', 16)), ('arguments', ('<u1', 1024))], align=True)
assert H.itemsize == 24 and D.itemsize == 1041
h = b[:24].view(H)[0]
nf, ns, ps, atp = int(h['num_fields']), int(h['num_samples']), int(h['page_size']), int(h['alloc_table_ptr'])
descs = b[24:24 + 1041 * nf].view(D)
meta_types = {
    0: np.dtype('<f8'), 1: np.dtype('<i8'),
    2: np.dtype([('mode', '<u1'), ('width', '<u2'), ('height', '<u2'), ('data_ptr', '<u8')]),
    3: np.dtype([('ptr', '<u8'), ('size', '<u8')]), 4: np.dtype('<u8'),
    5: np.dtype([('ptr', '<u8'), ('size', '<u8')]),
}
names = [bytes(d['name']).rstrip(b'\0').decode('ascii') for d in descs]
tids = [int(d['type_id']) for d in descs]
M = np.dtype([(n, meta_types[t]) for n, t in zip(names, tids)], align=True)
ms = 24 + 1041 * nf
meta = b[ms:ms + M.itemsize * ns].view(M)
data_start = -(-(ms + M.itemsize * ns) // ps) * ps
A = b[atp:].view('<u8').reshape(-1, 3)
order = np.argsort(A[:, 1], kind='stable')
ptrs, sizes = A[order, 1], A[order, 2]
for sid, ptr, size in A:
    assert ptr >= data_start and ptr + size <= atp
    assert (ptr - data_start) // ps == (ptr + size - 1 - data_start) // ps, 'straddles a page'

def read(ptr):
    i = int(np.searchsorted(ptrs, ptr))
    assert ptrs[i] == ptr
    return bytes(b[int(ptr):int(ptr + sizes[i])])

nd = {}
for n, t, d in zip(names, tids, descs):
    if t == 4:
        args = d['arguments']
        shape = [int(x) for x in args[:256].view('<u8')]
        while shape and shape[-1] == 0:
            shape.pop()
        tl = int(args[256:264].view('<u8')[0])
        descr = json.loads(bytes(args[264:264 + tl]).decode('ascii'))
        nd[n] = (np.dtype([tuple(x) for x in descr])['f0'], shape)

out = {'version': int(h['version']), 'names': names, 'type_ids': tids, 'row_size': M.itemsize,
       'data_start': data_start, 'alloc_rows': len(A), 'samples': []}
for i in range(ns):
    row, s = meta[i], {}
    for n, t in zip(names, tids):
        if t == 0:
            s[n] = float(row[n])
        elif t == 1:
            s[n] = int(row[n])
        elif t == 3:
            data = read(row[n]['ptr'])
            assert len(data) == int(row[n]['size'])
            s[n] = data.hex()
        elif t == 5:
            data = read(row[n]['ptr'])
            assert len(data) == int(row[n]['size']) and data[-1] == 0
            s[n] = json.loads(data[:-1].decode('utf8'))
        elif t == 4:
            dt, shape = nd[n]
            s[n] = {'dtype': dt.str, 'shape': shape,
                    'data': np.frombuffer(read(row[n]), dtype=dt).reshape(shape).ravel().tolist()}
        elif t == 2:
            r = row[n]
            s[n] = {'mode': int(r['mode']), 'width': int(r['width']), 'height': int(r['height']),
                    'data': read(r['data_ptr']).hex()}
    out['samples'].append(s)
print(json.dumps(out))
"#;

#[test]
fn beton_written_here_matches_ffcv_layout_in_numpy() {
    let Some(py) = test_support::python() else {
        return;
    };
    let fields = vec![
        BetonField::new("label", BetonType::Int),
        BetonField::new("img", BetonType::RgbImage),
        BetonField::new("weight", BetonType::Float),
        BetonField::new("raw", BetonType::Bytes),
        BetonField::new(
            "emb",
            BetonType::NDArray {
                dtype: DType::F64,
                shape: [2, 3].into(),
            },
        ),
        BetonField::new("info", BetonType::Json),
        BetonField::new("jpeg", BetonType::RgbImage),
    ];
    let n = 60;
    // Large images push samples over page boundaries, exercising restarts.
    let pixels: Vec<Vec<u8>> = (0..n)
        .map(|i| (0..(20 + i) * 300 * 3).map(|j| (i + j) as u8).collect())
        .collect();
    let raws: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 1 + i * 7]).collect();
    let embs: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            (0..6)
                .flat_map(|k| (i as f64 * 10.0 + k as f64).to_le_bytes())
                .collect()
        })
        .collect();
    let infos: Vec<String> = (0..n)
        .map(|i| format!("{{\"i\": {i}, \"tag\": \"t{}\"}}", i % 3))
        .collect();
    let jpegs: Vec<Vec<u8>> = (0..n)
        .map(|i| vec![0xff, 0xd8, i as u8, 0xff, 0xd9])
        .collect();
    let samples: Vec<Vec<BetonValue>> = (0..n)
        .map(|i| {
            vec![
                BetonValue::Int(i as i64 - 30),
                BetonValue::RgbImage {
                    mode: 1,
                    width: 300,
                    height: (20 + i) as u16,
                    data: &pixels[i],
                },
                BetonValue::Float(i as f64 * 0.5),
                BetonValue::Bytes(&raws[i]),
                BetonValue::NDArray(TensorView::new(DType::F64, [2, 3], &embs[i]).unwrap()),
                BetonValue::Json(&infos[i]),
                BetonValue::RgbImage {
                    mode: 0,
                    width: 8,
                    height: 9,
                    data: &jpegs[i],
                },
            ]
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.beton");
    beton::write_with_page_size(&path, &fields, &samples, 2 << 20).unwrap();

    // Our reader agrees with what was written.
    let file = beton::read(&path).unwrap();
    assert_eq!(file.fields(), &fields[..]);
    for (i, want) in samples.iter().enumerate() {
        assert_eq!(&file.sample(i).unwrap(), want, "sample {i}");
    }

    // numpy, following FFCV's dtypes, reads the same.
    let out: Json =
        serde_json::from_str(&test_support::run_python(&py, NUMPY_READER, &[&path])).unwrap();
    assert_eq!(out["version"], 2);
    assert_eq!(out["type_ids"], serde_json::json!([1, 2, 0, 3, 4, 5, 2]));
    // i64, packed image (13 B) padded to 8, f64, packed bytes, u64, packed json, packed image.
    assert_eq!(out["row_size"], 8 + 13 + 3 + 8 + 16 + 8 + 16 + 13 + 3);
    assert_eq!(out["alloc_rows"], n * 5);
    for (i, s) in out["samples"].as_array().unwrap().iter().enumerate() {
        assert_eq!(s["label"], i as i64 - 30);
        assert_eq!(s["weight"], i as f64 * 0.5);
        assert_eq!(s["raw"], hex(&raws[i]));
        assert_eq!(s["img"]["mode"], 1);
        assert_eq!(s["img"]["width"], 300);
        assert_eq!(s["img"]["height"], 20 + i);
        assert_eq!(s["img"]["data"], hex(&pixels[i]));
        assert_eq!(s["jpeg"]["mode"], 0);
        assert_eq!(s["jpeg"]["data"], hex(&jpegs[i]));
        assert_eq!(s["emb"]["dtype"], "<f8");
        assert_eq!(s["emb"]["shape"], serde_json::json!([2, 3]));
        let emb: Vec<f64> = (0..6).map(|k| i as f64 * 10.0 + k as f64).collect();
        assert_eq!(s["emb"]["data"], serde_json::json!(emb));
        assert_eq!(s["info"], serde_json::from_str::<Json>(&infos[i]).unwrap());
    }
}
