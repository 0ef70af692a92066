//! The indenting writer the region's sections print through.

/// Lines of C at an indentation: the region's own depth in the kernel
/// (`pad`) plus two spaces for each level a section asks for. The sections
/// pass levels relative to the region's opening brace, as the printed
/// blocks nest; writing into a `String` cannot fail, so no line carries a
/// `Result` to drop.
pub(super) struct Lines {
    text: String,
    pad: String,
}

impl Lines {
    /// An empty region at `depth` levels of the kernel.
    pub(super) fn new(depth: usize) -> Self {
        Lines {
            text: String::new(),
            pad: "  ".repeat(depth),
        }
    }

    /// One line, `level` levels inside the region.
    pub(super) fn line(&mut self, level: usize, line: impl AsRef<str>) {
        self.text.push_str(&self.pad);
        for _ in 0..level {
            self.text.push_str("  ");
        }
        self.text.push_str(line.as_ref());
        self.text.push('\n');
    }

    /// The text printed so far.
    pub(super) fn finish(self) -> String {
        self.text
    }
}
