// Export of the current view: a PNG (the view's canvases and text drawn on
// one canvas at their on-screen places) and a self-contained HTML file (the
// view's DOM with its canvases as inline PNG images and the stylesheet
// inline; no script, no external reference).

function download(name, blob) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

// Text nodes of `root` with their boxes: every element whose only child is
// text.
function texts(root) {
  return [...root.querySelectorAll("*")].filter(
    (node) => node.childNodes.length === 1 && node.firstChild.nodeType === Node.TEXT_NODE);
}

const MARGIN = 12;

// The box of what `view` shows (its own box is as wide as the page).
function contentBox(view) {
  let right = 0, bottom = 0;
  const box = view.getBoundingClientRect();
  for (const node of view.querySelectorAll("*")) {
    const r = node.getBoundingClientRect();
    if (r.width && r.height) {
      right = Math.max(right, r.right);
      bottom = Math.max(bottom, r.bottom);
    }
  }
  return { left: box.left - MARGIN, top: box.top - MARGIN,
    width: right - box.left + 2 * MARGIN, height: bottom - box.top + 2 * MARGIN };
}

export function viewCanvas(view) {
  const box = contentBox(view);
  const canvas = document.createElement("canvas");
  canvas.width = Math.ceil(box.width);
  canvas.height = Math.ceil(box.height);
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#ffffff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.imageSmoothingEnabled = false;
  for (const source of view.querySelectorAll("canvas")) {
    const r = source.getBoundingClientRect();
    ctx.drawImage(source, r.left - box.left, r.top - box.top, r.width, r.height);
  }
  ctx.textBaseline = "middle";
  for (const node of texts(view)) {
    const r = node.getBoundingClientRect();
    if (!r.width || !r.height) continue;
    const style = getComputedStyle(node);
    ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    ctx.fillStyle = style.color;
    const text = node.textContent;
    ctx.save();
    if (style.writingMode.startsWith("vertical")) {
      // Key labels read bottom to top.
      ctx.translate(r.left - box.left + r.width / 2, r.bottom - box.top);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(text, 0, 0);
    } else {
      const right = style.textAlign === "right" || style.textAlign === "end";
      ctx.textAlign = right ? "right" : "left";
      ctx.fillText(text, (right ? r.right : r.left) - box.left, r.top - box.top + r.height / 2);
    }
    ctx.restore();
  }
  return canvas;
}

export function exportPng(view, name) {
  viewCanvas(view).toBlob((blob) => download(name, blob), "image/png");
}

export async function htmlDocument(view) {
  const css = await (await fetch("./style.css")).text();
  const copy = view.cloneNode(true);
  const sources = view.querySelectorAll("canvas");
  copy.querySelectorAll("canvas").forEach((canvas, i) => {
    const image = document.createElement("img");
    image.src = sources[i].toDataURL("image/png");
    image.className = canvas.className;
    image.width = sources[i].width;
    image.height = sources[i].height;
    image.style.imageRendering = "pixelated";
    canvas.replaceWith(image);
  });
  const title = view.querySelector(".viewtitle")?.textContent ?? "attention";
  const escape = (s) => s.replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c]);
  return `<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>${escape(title)}</title>` +
    `<style>${css}</style></head><body><div id="root">${copy.outerHTML}</div></body></html>\n`;
}

export async function exportHtml(view, name) {
  download(name, new Blob([await htmlDocument(view)], { type: "text/html" }));
}
