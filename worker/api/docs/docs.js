// The API reference: Swagger UI over this origin's /openapi.json. A file of its own, not an
// inline script: the page's Content-Security-Policy allows scripts from this origin only.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  displayRequestDuration: true,
  validatorUrl: null, // never send the document to a third-party validator
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
