//! PDF and PNG versions of a figure, made from the SVG that plotters draws.
//!
//! plotters' SVG backend writes a small subset of SVG (`line`, `polyline`, `polygon`, `rect`,
//! `circle`, `text`, opaque colours, text rotated about its anchor), so the figure is parsed
//! back into shapes and written out again: PDF by hand (vector, text in the base-14 font
//! Helvetica, which every PDF reader has: nothing is embedded), PNG by a small rasteriser
//! (anti-aliased shapes; text from an 8×8 bitmap font, scaled) and a zlib stream from flate2.
//! No font library, no image crate.

use anyhow::{anyhow, bail, Context, Result};

/// An RGB colour, 0..=255 per channel.
type Rgb = [u8; 3];

/// One drawing primitive of the figure, in SVG pixel coordinates (y down).
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// Connected segments.
    Lines {
        pts: Vec<(f64, f64)>,
        color: Rgb,
        width: f64,
    },
    Polygon {
        pts: Vec<(f64, f64)>,
        color: Rgb,
    },
    Rect {
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: Option<Rgb>,
        stroke: Option<Rgb>,
    },
    Circle {
        cx: f64,
        cy: f64,
        r: f64,
        fill: Option<Rgb>,
        stroke: Option<Rgb>,
    },
    /// `anchor`: 0 start, 0.5 middle, 1 end; `(x, y)` is the baseline's anchor point after
    /// the vertical offset; `angle` is clockwise in degrees about `(x, y)`.
    Text {
        x: f64,
        y: f64,
        size: f64,
        anchor: f64,
        angle: f64,
        color: Rgb,
        text: String,
    },
}

/// A figure: its size in pixels and its shapes in drawing order.
#[derive(Clone, Debug)]
pub struct Figure {
    pub width: f64,
    pub height: f64,
    pub shapes: Vec<Shape>,
}

fn num(n: roxmltree::Node, attr: &str) -> f64 {
    n.attribute(attr)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `#RRGGBB` (or `none`/absent → None), blended over white by `opacity`.
fn paint(n: roxmltree::Node, attr: &str) -> Option<Rgb> {
    let v = n.attribute(attr)?;
    let hex = v.strip_prefix('#').filter(|h| h.len() == 6)?;
    let ch = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or(0);
    let op = n.attribute("opacity").and_then(|o| o.parse::<f64>().ok());
    let op = op.unwrap_or(1.0).clamp(0.0, 1.0);
    let blend = |c: u8| (c as f64 * op + 255.0 * (1.0 - op)).round() as u8;
    Some([blend(ch(0)), blend(ch(2)), blend(ch(4))])
}

fn points(n: roxmltree::Node) -> Vec<(f64, f64)> {
    let v: Vec<f64> = n
        .attribute("points")
        .unwrap_or("")
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter_map(|s| s.parse().ok())
        .collect();
    v.chunks_exact(2).map(|p| (p[0], p[1])).collect()
}

/// The text's baseline offset from `dy` (`0.76em`, `-0.5ex`, `0.5ex`, or pixels).
fn dy(n: roxmltree::Node, size: f64) -> f64 {
    let v = n.attribute("dy").unwrap_or("0");
    let (val, unit) = v.split_at(v.find(|c: char| c.is_alphabetic()).unwrap_or(v.len()));
    let x: f64 = val.parse().unwrap_or(0.0);
    match unit {
        "em" => x * size,
        "ex" => x * size * 0.5,
        _ => x,
    }
}

fn text(n: roxmltree::Node) -> Shape {
    let size = num(n, "font-size");
    let anchor = match n.attribute("text-anchor") {
        Some("middle") => 0.5,
        Some("end") => 1.0,
        _ => 0.0,
    };
    let angle: f64 = n
        .attribute("transform")
        .and_then(|t| t.trim().strip_prefix("rotate("))
        .and_then(|t| t.split([',', ')']).next())
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or(0.0);
    let text: String = n.text().unwrap_or("").trim().to_string();
    let (x, y, d) = (num(n, "x"), num(n, "y"), dy(n, size));
    // The vertical offset is along the text's own "down", which the rotation turns.
    let (s, c) = angle.to_radians().sin_cos();
    Shape::Text {
        x: x - d * s,
        y: y + d * c,
        size,
        anchor,
        angle,
        color: paint(n, "fill").unwrap_or([0, 0, 0]),
        text,
    }
}

/// The shapes of an SVG written by plotters.
pub fn parse(svg: &str) -> Result<Figure> {
    let doc = roxmltree::Document::parse(svg).context("parsing the drawn SVG")?;
    let root = doc.root_element();
    let mut shapes = Vec::new();
    for n in root.descendants().filter(|n| n.is_element()) {
        let stroke_w = n
            .attribute("stroke-width")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1.0);
        match n.tag_name().name() {
            "line" => shapes.push(Shape::Lines {
                pts: vec![(num(n, "x1"), num(n, "y1")), (num(n, "x2"), num(n, "y2"))],
                color: paint(n, "stroke").unwrap_or([0, 0, 0]),
                width: stroke_w,
            }),
            "polyline" => shapes.push(Shape::Lines {
                pts: points(n),
                color: paint(n, "stroke").unwrap_or([0, 0, 0]),
                width: stroke_w,
            }),
            "polygon" => shapes.push(Shape::Polygon {
                pts: points(n),
                color: paint(n, "fill").unwrap_or([0, 0, 0]),
            }),
            "rect" => shapes.push(Shape::Rect {
                x: num(n, "x"),
                y: num(n, "y"),
                w: num(n, "width"),
                h: num(n, "height"),
                fill: paint(n, "fill"),
                stroke: paint(n, "stroke"),
            }),
            "circle" => shapes.push(Shape::Circle {
                cx: num(n, "cx"),
                cy: num(n, "cy"),
                r: num(n, "r"),
                fill: paint(n, "fill"),
                stroke: paint(n, "stroke"),
            }),
            "text" => shapes.push(text(n)),
            "svg" => {}
            other => {
                bail!("the drawn SVG has a <{other}> element, which PDF/PNG export does not know")
            }
        }
    }
    Ok(Figure {
        width: num(root, "width"),
        height: num(root, "height"),
        shapes,
    })
}

// ---------------------------------------------------------------------------------------
// PDF

/// Helvetica's advance widths (1/1000 em) for ASCII 32..=126, from its AFM.
const HELVETICA: [u16; 95] = [
    278, 278, 355, 556, 556, 889, 667, 191, 333, 333, 389, 584, 278, 333, 278, 278, 556, 556, 556,
    556, 556, 556, 556, 556, 556, 556, 278, 278, 584, 584, 584, 556, 1015, 667, 667, 722, 722, 667,
    611, 778, 722, 278, 500, 667, 556, 833, 722, 778, 667, 778, 722, 667, 611, 722, 667, 944, 667,
    667, 611, 278, 278, 278, 469, 556, 333, 556, 556, 500, 556, 556, 278, 556, 556, 222, 222, 500,
    222, 833, 556, 556, 556, 556, 333, 500, 278, 556, 500, 722, 500, 500, 500, 334, 260, 334, 584,
];

/// A character in WinAnsiEncoding (the text's font encoding), with its width; characters
/// the encoding lacks are spelled out (`α` → `alpha`).
fn win_ansi(c: char) -> Vec<(u8, u16)> {
    let one = |b: u8, w: u16| vec![(b, w)];
    match c {
        ' '..='~' => one(c as u8, HELVETICA[(c as u8 - 32) as usize]),
        'µ' | 'μ' => one(0xB5, 556),
        '×' => one(0xD7, 584),
        '·' => one(0xB7, 278),
        '–' => one(0x96, 556),
        '—' => one(0x97, 1000),
        '≈' => win_ansi('~'),
        '≤' => "<=".chars().flat_map(win_ansi).collect(),
        '≥' => ">=".chars().flat_map(win_ansi).collect(),
        'α' => "alpha".chars().flat_map(win_ansi).collect(),
        'β' => "beta".chars().flat_map(win_ansi).collect(),
        'σ' => "sigma".chars().flat_map(win_ansi).collect(),
        _ => win_ansi('?'),
    }
}

fn pdf_string(text: &str) -> (Vec<u8>, f64) {
    let mut out = vec![b'('];
    let mut width = 0u32;
    for (b, w) in text.chars().flat_map(win_ansi) {
        if matches!(b, b'(' | b')' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
        width += w as u32;
    }
    out.push(b')');
    (out, width as f64 / 1000.0)
}

fn rgb_op(c: Rgb, op: &str) -> String {
    let f = |v: u8| v as f64 / 255.0;
    format!("{:.3} {:.3} {:.3} {op}\n", f(c[0]), f(c[1]), f(c[2]))
}

/// The page's content stream: PDF's y axis points up, so y becomes `h - y`.
fn pdf_content(fig: &Figure) -> Vec<u8> {
    let h = fig.height;
    let mut s: Vec<u8> = b"1 J 1 j\n".to_vec();
    for shape in &fig.shapes {
        match shape {
            Shape::Lines { pts, color, width } if pts.len() > 1 => {
                let mut t = rgb_op(*color, "RG") + &format!("{width} w\n");
                for (i, (x, y)) in pts.iter().enumerate() {
                    let op = if i == 0 { "m" } else { "l" };
                    t += &format!("{x:.2} {:.2} {op}\n", h - y);
                }
                put(&mut s, t + "S\n");
            }
            Shape::Polygon { pts, color } if pts.len() > 2 => {
                let mut t = rgb_op(*color, "rg");
                for (i, (x, y)) in pts.iter().enumerate() {
                    let op = if i == 0 { "m" } else { "l" };
                    t += &format!("{x:.2} {:.2} {op}\n", h - y);
                }
                put(&mut s, t + "h f\n");
            }
            Shape::Rect {
                x,
                y,
                w,
                h: rh,
                fill,
                stroke,
            } => {
                let r = format!("{x:.2} {:.2} {w:.2} {rh:.2} re ", h - y - rh);
                if let Some(c) = fill {
                    put(&mut s, rgb_op(*c, "rg") + &r + "f\n");
                }
                if let Some(c) = stroke {
                    put(&mut s, rgb_op(*c, "RG") + "1 w\n" + &r + "S\n");
                }
            }
            Shape::Circle {
                cx,
                cy,
                r,
                fill,
                stroke,
            } => {
                let path = circle_path(*cx, h - cy, *r);
                if let Some(c) = fill {
                    put(&mut s, rgb_op(*c, "rg") + &path + "f\n");
                }
                if let Some(c) = stroke {
                    put(&mut s, rgb_op(*c, "RG") + "1 w\n" + &path + "S\n");
                }
            }
            Shape::Text { .. } => pdf_text(&mut s, shape, h),
            _ => {}
        }
    }
    s
}

/// A text object: the start point moved back along the text's direction by the anchor's
/// share of its width, rotated by the text matrix.
fn pdf_text(s: &mut Vec<u8>, shape: &Shape, h: f64) {
    let Shape::Text {
        x,
        y,
        size,
        anchor,
        angle,
        color,
        text,
    } = shape
    else {
        return;
    };
    let (bytes, em) = pdf_string(text);
    let (sin, cos) = (-angle).to_radians().sin_cos();
    let back = em * size * anchor;
    let (px, py) = (x - back * cos, (h - y) - back * sin);
    put(s, rgb_op(*color, "rg"));
    put(
        s,
        format!(
            "BT /F1 {size:.2} Tf {cos:.4} {sin:.4} {:.4} {cos:.4} {px:.2} {py:.2} Tm ",
            -sin
        ),
    );
    s.extend_from_slice(&bytes);
    s.extend_from_slice(b" Tj ET\n");
}

fn put(s: &mut Vec<u8>, t: String) {
    s.extend_from_slice(t.as_bytes());
}

/// A circle as four Bézier curves.
fn circle_path(cx: f64, cy: f64, r: f64) -> String {
    let k = 0.552_284_749_8 * r;
    format!(
        "{:.2} {cy:.2} m {:.2} {:.2} {:.2} {:.2} {cx:.2} {:.2} c {:.2} {:.2} {:.2} {:.2} {:.2} {cy:.2} c \
         {:.2} {:.2} {:.2} {:.2} {cx:.2} {:.2} c {:.2} {:.2} {:.2} {:.2} {:.2} {cy:.2} c ",
        cx + r,
        cx + r, cy + k, cx + k, cy + r, cy + r,
        cx - k, cy + r, cx - r, cy + k, cx - r,
        cx - r, cy - k, cx - k, cy - r, cy - r,
        cx + k, cy - r, cx + r, cy - k, cx + r,
    )
}

/// A one-page PDF of the figure, 1 SVG pixel = 1 pt.
pub fn to_pdf(svg: &str) -> Result<Vec<u8>> {
    let fig = parse(svg)?;
    let content = pdf_content(&fig);
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_string(),
        format!(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {} {}] /Contents 4 0 R \
             /Resources << /Font << /F1 5 0 R >> >> >>",
            fig.width, fig.height
        ),
        String::new(), // the content stream, below
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
            .to_string(),
    ];
    let mut out: Vec<u8> = b"%PDF-1.4\n%\xE2\xE3\xCF\xD3\n".to_vec();
    let mut offsets = Vec::new();
    for (i, body) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        if i == 3 {
            out.extend_from_slice(format!("<< /Length {} >>\nstream\n", content.len()).as_bytes());
            out.extend_from_slice(&content);
            out.extend_from_slice(b"\nendstream");
        } else {
            out.extend_from_slice(body.as_bytes());
        }
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for o in offsets {
        out.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// PNG

/// An RGB canvas with coverage-weighted painting.
struct Canvas {
    w: usize,
    h: usize,
    px: Vec<[f32; 3]>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Self {
        Canvas {
            w,
            h,
            px: vec![[1.0; 3]; w * h],
        }
    }

    fn blend(&mut self, x: i64, y: i64, c: Rgb, cover: f64) {
        if x < 0 || y < 0 || x as usize >= self.w || y as usize >= self.h || cover <= 0.0 {
            return;
        }
        let a = cover.min(1.0) as f32;
        let p = &mut self.px[y as usize * self.w + x as usize];
        for (ch, v) in p.iter_mut().zip(c) {
            *ch = *ch * (1.0 - a) + (v as f32 / 255.0) * a;
        }
    }

    /// Paints `c` where `cover(px, py)` (pixel centre) is positive, within a bounding box.
    fn fill(&mut self, bbox: (f64, f64, f64, f64), c: Rgb, cover: impl Fn(f64, f64) -> f64) {
        let (x0, y0, x1, y1) = bbox;
        let clamp = |v: f64, hi: usize| v.floor().clamp(0.0, hi as f64) as i64;
        for y in clamp(y0, self.h)..=clamp(y1, self.h) {
            for x in clamp(x0, self.w)..=clamp(x1, self.w) {
                let a = cover(x as f64 + 0.5, y as f64 + 0.5);
                self.blend(x, y, c, a);
            }
        }
    }

    fn segment(&mut self, a: (f64, f64), b: (f64, f64), width: f64, c: Rgb) {
        let half = width.max(1.0) / 2.0;
        let bbox = (
            a.0.min(b.0) - half - 1.0,
            a.1.min(b.1) - half - 1.0,
            a.0.max(b.0) + half + 1.0,
            a.1.max(b.1) + half + 1.0,
        );
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let len2 = dx * dx + dy * dy;
        self.fill(bbox, c, |x, y| {
            let t = if len2 > 0.0 {
                (((x - a.0) * dx + (y - a.1) * dy) / len2).clamp(0.0, 1.0)
            } else {
                0.0
            };
            let d = ((x - a.0 - t * dx).powi(2) + (y - a.1 - t * dy).powi(2)).sqrt();
            (half + 0.5 - d).clamp(0.0, 1.0)
        });
    }
}

/// Glyph rows of `c` in the 8×8 font (bit i of a row = column i), or None.
fn glyph(c: char) -> Option<[u8; 8]> {
    use font8x8::legacy::{BASIC_LEGACY, GREEK_LEGACY, LATIN_LEGACY};
    let u = c as usize;
    match u {
        0..=127 => Some(BASIC_LEGACY[u]),
        0xA0..=0xFF => Some(LATIN_LEGACY[u - 0xA0]),
        0x390..=0x3C9 => Some(GREEK_LEGACY[u - 0x390]),
        0x2013 | 0x2014 => Some(BASIC_LEGACY[b'-' as usize]),
        _ => Some(BASIC_LEGACY[b'?' as usize]),
    }
}

/// Text from the 8×8 font scaled to `size` (glyph cell = 0.6 em wide), rotated about (x, y).
fn draw_text(cv: &mut Canvas, t: &Shape, scale: f64) {
    let Shape::Text {
        x,
        y,
        size,
        anchor,
        angle,
        color,
        text,
    } = t
    else {
        return;
    };
    let cell = size * scale / 8.0 * 0.75; // 8 rows ≈ 0.75 em: cap height plus descender
    let advance = 8.0 * cell * 0.8;
    let n = text.chars().count() as f64;
    let start = -anchor * n * advance;
    let (sin, cos) = angle.to_radians().sin_cos();
    let (ox, oy) = (x * scale, y * scale);
    for (i, ch) in text.chars().enumerate() {
        let Some(rows) = glyph(ch) else { continue };
        for (ry, row) in rows.iter().enumerate() {
            for rx in 0..8 {
                if row >> rx & 1 == 0 {
                    continue;
                }
                // The cell's corner in text coordinates (u along the text, v down; the
                // baseline is at row 7 of the 8).
                let u = start + i as f64 * advance + rx as f64 * cell * 0.8;
                let v = (ry as f64 - 7.0) * cell;
                let (w, h) = (cell * 0.8, cell);
                let corners = [(u, v), (u + w, v), (u + w, v + h), (u, v + h)]
                    .map(|(a, b)| (ox + a * cos - b * sin, oy + a * sin + b * cos));
                fill_quad(cv, &corners, *color);
            }
        }
    }
}

/// A convex quadrilateral, anti-aliased by 4×4 samples per pixel.
fn fill_quad(cv: &mut Canvas, q: &[(f64, f64); 4], c: Rgb) {
    let (x0, x1) = q
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let (y0, y1) = q
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.1), a.1.max(p.1)));
    let inside = |x: f64, y: f64| {
        (0..4).all(|i| {
            let (a, b) = (q[i], q[(i + 1) % 4]);
            (b.0 - a.0) * (y - a.1) - (b.1 - a.1) * (x - a.0) >= 0.0
        }) || (0..4).all(|i| {
            let (a, b) = (q[i], q[(i + 1) % 4]);
            (b.0 - a.0) * (y - a.1) - (b.1 - a.1) * (x - a.0) <= 0.0
        })
    };
    cv.fill((x0, y0, x1, y1), c, |x, y| {
        let mut hits = 0;
        for sy in 0..4 {
            for sx in 0..4 {
                let (px, py) = (
                    x - 0.5 + (sx as f64 + 0.5) / 4.0,
                    y - 0.5 + (sy as f64 + 0.5) / 4.0,
                );
                hits += inside(px, py) as u32;
            }
        }
        hits as f64 / 16.0
    });
}

fn raster_shape(cv: &mut Canvas, shape: &Shape, s: f64) {
    match shape {
        Shape::Lines { pts, color, width } => {
            for w in pts.windows(2) {
                cv.segment(
                    (w[0].0 * s, w[0].1 * s),
                    (w[1].0 * s, w[1].1 * s),
                    width * s,
                    *color,
                );
            }
        }
        Shape::Polygon { pts, color } => {
            // Plotters' polygons here are convex (markers); a fan of triangles as quads.
            for w in pts.windows(2).skip(1) {
                let q = [pts[0], w[0], w[1], w[1]].map(|p| (p.0 * s, p.1 * s));
                fill_quad(cv, &q, *color);
            }
        }
        Shape::Rect {
            x,
            y,
            w,
            h,
            fill,
            stroke,
        } => {
            let (x0, y0, x1, y1) = (x * s, y * s, (x + w) * s, (y + h) * s);
            if let Some(c) = fill {
                let cover1 = |p: f64, lo: f64, hi: f64| {
                    ((p + 0.5).min(hi) - (p - 0.5).max(lo)).clamp(0.0, 1.0)
                };
                cv.fill((x0, y0, x1, y1), *c, |px, py| {
                    cover1(px, x0, x1) * cover1(py, y0, y1)
                });
            }
            if let Some(c) = stroke {
                let corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)];
                for w in corners.windows(2) {
                    cv.segment(w[0], w[1], s, *c);
                }
            }
        }
        Shape::Circle {
            cx,
            cy,
            r,
            fill,
            stroke,
        } => {
            let (cx, cy, r) = (cx * s, cy * s, r * s);
            let bbox = (cx - r - 1.0, cy - r - 1.0, cx + r + 1.0, cy + r + 1.0);
            let d = |x: f64, y: f64| ((x - cx).powi(2) + (y - cy).powi(2)).sqrt();
            if let Some(c) = fill {
                cv.fill(bbox, *c, |x, y| (r + 0.5 - d(x, y)).clamp(0.0, 1.0));
            }
            if let Some(c) = stroke {
                cv.fill(bbox, *c, |x, y| {
                    (s / 2.0 + 0.5 - (d(x, y) - r).abs()).clamp(0.0, 1.0)
                });
            }
        }
        Shape::Text { .. } => draw_text(cv, shape, s),
    }
}

/// A PNG of the figure at `scale` pixels per SVG pixel (8-bit RGB, zlib-compressed).
pub fn to_png(svg: &str, scale: f64) -> Result<Vec<u8>> {
    let fig = parse(svg)?;
    let (w, h) = (
        (fig.width * scale).round() as usize,
        (fig.height * scale).round() as usize,
    );
    // 12 bytes a pixel while drawing: 25 M pixels is 300 MB.
    if w == 0 || h == 0 || w * h > 25_000_000 {
        bail!(
            "a PNG of {w}x{h} pixels is too large to draw (at most 25 M pixels: --size up to \
             about 3500x3500 gives twice that); write SVG or PDF instead"
        );
    }
    let mut cv = Canvas::new(w, h);
    for shape in &fig.shapes {
        raster_shape(&mut cv, shape, scale);
    }
    let mut raw = Vec::with_capacity((w * 3 + 1) * h);
    for row in cv.px.chunks(w) {
        raw.push(0u8); // filter: none
        for p in row {
            raw.extend(p.iter().map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8));
        }
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut z, &raw).map_err(|e| anyhow!("compressing the PNG: {e}"))?;
    let idat = z
        .finish()
        .map_err(|e| anyhow!("compressing the PNG: {e}"))?;
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit, RGB, deflate, no filter, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, data) in [
        (b"IHDR", &ihdr[..]),
        (b"IDAT", &idat[..]),
        (b"IEND", &[][..]),
    ] {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32fast::hash(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Files

/// A figure file format, picked by `-o`'s extension or named by `--also`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FigFormat {
    Svg,
    Pdf,
    Png,
}

impl FigFormat {
    /// Every format, in the order `--help` lists them.
    pub const ALL: &'static [FigFormat] = &[FigFormat::Svg, FigFormat::Pdf, FigFormat::Png];

    /// Its name on the command line (`--also`), its file extension.
    pub const fn name(self) -> &'static str {
        self.ext()
    }

    /// One line for `--help` (none: the name says it).
    pub const fn help(self) -> Option<&'static str> {
        None
    }

    /// The format of `path` by its extension (case-insensitive), None when it names none
    /// of them.
    pub fn of_path(path: &std::path::Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        FigFormat::ALL.iter().copied().find(|f| f.ext() == ext)
    }

    pub const fn ext(self) -> &'static str {
        match self {
            FigFormat::Svg => "svg",
            FigFormat::Pdf => "pdf",
            FigFormat::Png => "png",
        }
    }

    /// The file's bytes; PNG at twice the SVG's pixel size.
    pub fn encode(self, svg: &str) -> Result<Vec<u8>> {
        match self {
            FigFormat::Svg => Ok(svg.as_bytes().to_vec()),
            FigFormat::Pdf => to_pdf(svg),
            FigFormat::Png => to_png(svg, 2.0),
        }
    }
}

gradkit_core::named!(FigFormat, "--also");

/// `-o PATH` plus `--also` formats: each file with its format, `PATH` first, the others
/// beside it with their own extension (duplicates dropped).
pub fn targets(
    output: &std::path::Path,
    first: FigFormat,
    also: &[FigFormat],
) -> Vec<(std::path::PathBuf, FigFormat)> {
    let mut out = vec![(output.to_path_buf(), first)];
    for f in also {
        if out.iter().all(|(_, g)| g != f) {
            out.push((output.with_extension(f.ext()), *f));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVG: &str = r##"<svg width="40" height="10" viewBox="0 0 40 10" xmlns="http://www.w3.org/2000/svg">
<rect x="0" y="0" width="40" height="10" opacity="1" fill="#FFFFFF" stroke="none"/>
<rect x="2" y="2" width="4" height="4" opacity="1" fill="#FF0000" stroke="none"/>
<polyline fill="none" opacity="1" stroke="#0000FF" stroke-width="2" points="10,1 10,9 "/>
<text x="30" y="5" dy="0.5ex" text-anchor="middle" font-family="sans-serif" font-size="10" opacity="0.5" fill="#000000">A(b)</text>
</svg>"##;

    #[test]
    fn shapes_parse() {
        let f = parse(SVG).unwrap();
        assert_eq!((f.width, f.height, f.shapes.len()), (40.0, 10.0, 4));
        let Shape::Text {
            y,
            anchor,
            color,
            text,
            ..
        } = &f.shapes[3]
        else {
            panic!("not text: {:?}", f.shapes[3]);
        };
        // dy 0.5ex of a 10 px font: 2.5 px down; opacity 0.5 over white: grey 128.
        assert_eq!(
            (*y, *anchor, *color, text.as_str()),
            (7.5, 0.5, [128, 128, 128], "A(b)")
        );
    }

    /// The pixels of a PNG written by `to_png` (8-bit RGB, filter 0 on every row).
    fn pixels(png: &[u8]) -> (usize, Vec<u8>) {
        let w = u32::from_be_bytes(png[16..20].try_into().unwrap()) as usize;
        let len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        assert_eq!(&png[37..41], b"IDAT");
        let mut raw = Vec::new();
        let mut z = flate2::read::ZlibDecoder::new(&png[41..41 + len]);
        std::io::Read::read_to_end(&mut z, &mut raw).unwrap();
        let rows: Vec<u8> = raw
            .chunks(w * 3 + 1)
            .flat_map(|r| r[1..].to_vec())
            .collect();
        (w, rows)
    }

    #[test]
    fn png_pixels() {
        let (w, px) = pixels(&to_png(SVG, 1.0).unwrap());
        let at = |x: usize, y: usize| px[(y * w + x) * 3..(y * w + x) * 3 + 3].to_vec();
        assert_eq!(at(3, 3), [255, 0, 0], "inside the red square");
        assert_eq!(at(0, 0), [255, 255, 255], "background");
        assert_eq!(at(7, 3), [255, 255, 255], "right of the square");
        assert_eq!(at(9, 5)[2], 255, "the blue line");
        assert!(
            at(9, 5)[0] < 40,
            "the blue line covers its pixel: {:?}",
            at(9, 5)
        );
    }

    #[test]
    fn pdf_text_is_escaped_and_anchored() {
        let pdf = String::from_utf8_lossy(&to_pdf(SVG).unwrap()).into_owned();
        // "A(b)": A 667 + ( 333 + b 556 + ) 333 = 1.889 em; middle anchor at x = 30, 10 pt;
        // the baseline 7.5 px down is 2.5 pt up from the bottom of a 10 pt page.
        let x = 30.0 - 1.889 * 10.0 / 2.0;
        assert!(
            pdf.contains(&format!("{x:.2} 2.50 Tm (A\\(b\\)) Tj")),
            "{pdf}"
        );
        assert!(
            pdf.contains("2.00 4.00 4.00 4.00 re"),
            "the square, y flipped: {pdf}"
        );
    }
}
