// Render the math that pymdownx.arithmatex (generic mode) marks: \( ... \) inline and \[ ... \]
// display, inside elements of class "arithmatex" only, on every page load (also with Material's
// instant navigation, through document$).
document$.subscribe(({ body }) => {
  for (const element of body.querySelectorAll(".arithmatex")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
});
